import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { subjectCovers, subjectMatches, subjectsOverlap, uncovered } from "../runtime/subjects.ts";

describe("subjects a stream captures (docs/runtime.md §6.3)", () => {
  it("says which pattern covers which, and which overlap", () => {
    expect(subjectCovers("*.provisioner.rotated", "keycloak.provisioner.rotated")).toBe(true);
    expect(subjectCovers("keycloak.provisioner.rotated", "*.provisioner.rotated")).toBe(false);
    expect(subjectCovers("a.>", "a.*.c")).toBe(true);
    expect(subjectCovers("a.>", "a")).toBe(false);
    expect(subjectCovers(">", "*.>")).toBe(true);
    expect(subjectCovers("*.>", ">")).toBe(false);
    expect(subjectCovers("a.*", "a.>")).toBe(false);
    expect(subjectsOverlap("x.*.c", "x.b.*")).toBe(true);
    expect(subjectsOverlap("x.*.c", "x.b.d")).toBe(false);
    expect(subjectsOverlap("y.>", "y")).toBe(false);
    expect(subjectsOverlap("a.*", "a.b.c")).toBe(false);
    expect(uncovered(["k.provisioner.rotated", "*.provisioner.rotated", "*.provisioner.failing", "*.provisioner.rotated"])).toEqual([
      "*.provisioner.rotated",
      "*.provisioner.failing",
    ]);
  });

  it("covers only what it matches: every subject the covered pattern matches, the covering one matches", () => {
    const token = fc.constantFrom("a", "b", "c");
    const pattern = fc
      .tuple(fc.array(fc.oneof(token, fc.constant("*")), { minLength: 1, maxLength: 3 }), fc.boolean())
      .map(([tokens, tail]) => [...tokens, ...(tail ? [">"] : [])].join("."));
    const subject = fc.array(token, { minLength: 1, maxLength: 5 }).map((t) => t.join("."));
    fc.assert(
      fc.property(pattern, pattern, fc.array(subject, { maxLength: 30 }), (p, q, subjects) => {
        const both = subjects.filter((s) => subjectMatches(q, s));
        if (subjectCovers(p, q)) expect(both.every((s) => subjectMatches(p, s))).toBe(true);
        if (subjects.some((s) => subjectMatches(p, s) && subjectMatches(q, s))) expect(subjectsOverlap(p, q)).toBe(true);
      }),
    );
  });
});
