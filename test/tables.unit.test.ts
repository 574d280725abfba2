import { afterEach, describe, expect, it } from "vitest";
import { shown, showWhole } from "../cli/ask.ts";

describe("table cells", () => {
  afterEach(() => showWhole(false));

  it("cut a longer text with … unless shown whole (--wide), and never show control characters", () => {
    const long = "x".repeat(100);
    expect(shown(long, 10)).toBe(`${"x".repeat(9)}…`);
    expect(shown("a\u0007b", 10)).toBe("a\\u0007b");
    showWhole(true);
    expect(shown(long, 10)).toBe(long);
    expect(shown("a\u0007b", 10)).toBe("a\\u0007b");
  });
});
