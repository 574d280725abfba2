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

describe("nodes' and checks' tables", () => {
  const now = new Date("2026-12-03T12:00:00Z");

  it("name the keys out of shape after the table, and with no entry too", async () => {
    const { formatNodes } = await import("../cli/nodes.ts");
    const bad = [{ key: "presence:alder", reason: "value is not JSON: Unexpected token" }];
    const node = {
      key: "birch",
      node: "birch",
      presence: "reachable" as const,
      since: null,
      lastSeen: "2026-12-03T11:59:50Z",
      everySeconds: 15,
      client: null,
      modules: 2,
    };
    expect(
      formatNodes({ entries: [node], outOfShape: bad }, now)
        .split("\n")
        .slice(-3),
    ).toEqual(["", "out of shape (1):", "  presence:alder: value is not JSON: Unexpected token"]);
    expect(formatNodes({ entries: [], outOfShape: bad }, now)).toBe(
      "no nodes\n\nout of shape (1):\n  presence:alder: value is not JSON: Unexpected token",
    );
  });

  it("show a check with an empty message as -", async () => {
    const { formatChecks } = await import("../cli/checks.ts");
    const check = {
      key: "alder.gitea.postgres",
      node: "alder",
      module: "gitea",
      provision: "postgres",
      ok: false,
      reason: "AuthFailed",
      message: "",
      revision: null,
      since: "2026-12-03T11:00:00Z",
      at: "2026-12-03T11:00:00Z",
      confirmed: true,
    };
    const [, row] = formatChecks({ entries: [check], outOfShape: [] }, now).split("\n");
    expect(row).toMatch(/^alder +gitea +postgres +AuthFailed \S+ +yes +- +-$/);
  });
});
