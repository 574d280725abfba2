import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { decodeCollection, decodeKey, encodeCollection, filtersFor, TOKEN } from "../contract/keys.ts";

describe("collection codec (docs/buckets.md §2)", () => {
  it("writes the examples of the spec", () => {
    expect(encodeCollection("shell:zsh:normal")).toBe("shell=3Azsh=3Anormal");
    expect(encodeCollection("environment:posix")).toBe("environment=3Aposix");
    expect(encodeCollection("contribution:node-hotkeys:triggers")).toBe("contribution=3Anode-hotkeys=3Atriggers");
    expect(encodeCollection("=")).toBe("=3D");
    expect(encodeCollection(".")).toBe("=2E");
    expect(encodeCollection("a b*>")).toBe("a=20b=2A=3E");
    expect(encodeCollection("café")).toBe("caf=C3=A9");
    expect(encodeCollection("x_y-z/w")).toBe("x_y-z/w");
  });

  it("reads them back", () => {
    expect(decodeCollection("shell=3Azsh=3Anormal")).toEqual({ ok: true, name: "shell:zsh:normal" });
    expect(decodeCollection("caf=C3=A9")).toEqual({ ok: true, name: "café" });
    expect(decodeCollection("=3D")).toEqual({ ok: true, name: "=" });
  });

  it("refuses bad escapes, bytes that are not UTF-8 and non-canonical forms", () => {
    expect(decodeCollection("shell=3")).toMatchObject({ ok: false, reason: expect.stringContaining("bad = escape at offset 5") });
    expect(decodeCollection("shell=3a")).toMatchObject({ ok: false, reason: expect.stringContaining("bad = escape") });
    expect(decodeCollection("=ZZ")).toMatchObject({ ok: false, reason: expect.stringContaining("bad = escape at offset 0") });
    expect(decodeCollection("=FF")).toEqual({ ok: false, reason: "its = escapes are not UTF-8" });
    expect(decodeCollection("=41")).toMatchObject({ ok: false, reason: expect.stringContaining("not the canonical encoding") });
  });

  it("round-trips every well-formed string and always yields a valid token", () => {
    fc.assert(
      fc.property(
        fc.string({ unit: "binary", minLength: 1 }).filter((s) => s.isWellFormed()),
        (name) => {
          const token = encodeCollection(name);
          expect(token).toMatch(TOKEN);
          expect(decodeCollection(token)).toEqual({ ok: true, name });
        },
      ),
      { numRuns: 2000 },
    );
  });

  it("maps distinct names to distinct tokens", () => {
    fc.assert(
      fc.property(fc.string({ minLength: 1 }), fc.string({ minLength: 1 }), (a, b) => {
        fc.pre(a !== b);
        expect(encodeCollection(a)).not.toBe(encodeCollection(b));
      }),
    );
  });
});

describe("decodeKey (docs/buckets.md §2 key shapes)", () => {
  it("reads each bucket's fields", () => {
    expect(decodeKey("needs", "n1.gitea.config.db_url")).toEqual({
      ok: true,
      fields: { node: "n1", module: "gitea", kind: "config", name: "db_url" },
    });
    expect(decodeKey("applied", "n1.gitea")).toEqual({ ok: true, fields: { node: "n1", module: "gitea" } });
    expect(decodeKey("collect", "n1.shell=3Azsh=3Anormal.docker")).toEqual({
      ok: true,
      fields: { node: "n1", collection: "shell:zsh:normal", contributor: "docker" },
    });
    expect(decodeKey("registry", "config")).toEqual({ ok: true, fields: { kind: "config" } });
  });

  it("says why a key is out of shape", () => {
    expect(decodeKey("needs", "n1.gitea")).toEqual({ ok: false, reason: "needs keys have 4 tokens, this has 2" });
    expect(decodeKey("needs", "n1.gitea.config.db.url")).toEqual({ ok: false, reason: "needs keys have 4 tokens, this has 5" });
    expect(decodeKey("registry", "a.b")).toEqual({ ok: false, reason: "registry keys have 1 token, this has 2" });
    expect(decodeKey("applied", "n1.")).toEqual({ ok: false, reason: "token 2 (module) is empty" });
    expect(decodeKey("collect", "n1.shell=3.docker")).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/^token 2 \(collection\): bad = escape/),
    });
  });
});

describe("filtersFor", () => {
  it("narrows with the given tokens and reaches keys of every length", () => {
    expect(filtersFor("needs", {})).toEqual([">"]);
    expect(filtersFor("needs", { node: "n1" })).toEqual(["n1", "n1.>"]);
    expect(filtersFor("needs", { node: "n1", module: "gitea" })).toEqual(["n1.gitea", "n1.gitea.>"]);
    expect(filtersFor("needs", { kind: "secret" })).toEqual(["*.*.secret", "*.*.secret.>"]);
    expect(filtersFor("needs", { node: "n1", kind: "secret" })).toEqual(["n1.*.secret", "n1.*.secret.>"]);
    expect(filtersFor("applied", { node: "n1", module: "gitea" })).toEqual(["n1.gitea", "n1.gitea.>"]);
    expect(filtersFor("collect", { collection: "shell:zsh:normal" })).toEqual(["*.shell=3Azsh=3Anormal", "*.shell=3Azsh=3Anormal.>"]);
    expect(filtersFor("collect", { contributor: "docker" })).toEqual(["*.*.docker", "*.*.docker.>"]);
    expect(filtersFor("registry", { kind: "config" })).toEqual(["config", "config.>"]);
  });

  it("never holds a wildcard or an extra token a collection name brought", () => {
    fc.assert(
      fc.property(
        fc.string({ minLength: 1 }).filter((s) => s.isWellFormed()),
        (collection) => {
          const [exact, longer] = filtersFor("collect", { node: "n1", collection });
          expect(exact).toBe(`n1.${encodeCollection(collection)}`);
          expect(exact!.split(".")).toHaveLength(2);
          expect(longer).toBe(`${exact}.>`);
        },
      ),
    );
  });
});
