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

describe("ask history's table", () => {
  it("shows each event a line, newest first, then the refused ones and where more remain", async () => {
    const { formatHistory } = await import("../cli/history.ts");
    const text = formatHistory({
      what: "history",
      entries: [
        {
          key: "12",
          seq: 12,
          event: "rotated",
          provider: "keycloak",
          provision: "grafana-oidc",
          revision: "v2",
          at: "2026-12-02T08:00:00Z",
          storedAt: "2026-12-02T08:00:01.250Z",
        },
        {
          key: "11",
          seq: 11,
          event: "failing",
          provider: "keycloak",
          machine: "dogwood",
          consumer: "grafana",
          word: "invalid_client",
          at: "2026-12-02T07:59:00Z",
          storedAt: "2026-12-02T07:59:00.500Z",
        },
      ],
      outOfShape: [{ key: "10", reason: "not JSON" }],
      next: "c10",
    } as never);
    expect(text.split("\n")).toEqual([
      "SEQ  STORED               EVENT    PROVIDER  MACHINE  CONSUMER  SAYS",
      "12   2026-12-02 08:00:01  rotated  keycloak  every    every     grafana-oidc at v2",
      "11   2026-12-02 07:59:00  failing  keycloak  dogwood  grafana   invalid_client",
      "2 events, newest first",
      "",
      "refused (1):",
      "  10: not JSON",
      "",
      "more remain: --cursor c10",
    ]);
  });
});
