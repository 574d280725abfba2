import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { join } from "node:path";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { ConfigError, resolveConfig, start, type Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { isLoopback } from "../runtime/triggers/http.ts";
import { request, ROOT, SHIPPED_CONFIG, startSet, testBus, until } from "./helpers.ts";

const BIN = join(ROOT, "bin", "mesh-provisioner.mjs");
const CONFIG = join(ROOT, "wrangler-free.config.ts");
const TOKEN = "the-token-of-this-test-0123456789";
const REFUSED =
  "HTTP_HOST 0.0.0.0 is not a loopback address and no HTTP_TOKEN is set: anyone who reaches it could ask every route. " +
  "Set HTTP_TOKEN (http.token) to a token of at least 16 characters, or HTTP_TRUSTED_NETWORK=1 (http.trustedNetwork: true) " +
  "if only trusted machines reach that network";

let bus: TestBus;
let seat: NatsConnection;

beforeAll(async () => {
  bus = await testBus();
  seat = await bus.connect();
});
afterAll(async () => {
  await bus.stop();
});

const bearer = (token: string): RequestInit => ({ headers: { authorization: `Bearer ${token}` } });

/** A TCP port nothing listens on now. */
const freePort = (): Promise<number> =>
  new Promise((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });

/** `mesh-provisioner start` on the test bus with `env`, and what it wrote. */
function startCli(env: NodeJS.ProcessEnv) {
  const { user, password } = bus.server.seat;
  const { host } = new URL(bus.url);
  const child = spawn("node", [BIN, "-c", SHIPPED_CONFIG, "start"], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, NATS_URL: `nats://${user}:${password}@${host}`, HTTP_PORT: "0", ...env },
  });
  const said = { stdout: "", stderr: "" };
  child.stdout.on("data", (d) => (said.stdout += d));
  child.stderr.on("data", (d) => (said.stderr += d));
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return { child, said, exited };
}

describe("a host that is not loopback", () => {
  it("stops start without a token, naming HTTP_HOST and HTTP_TOKEN, before anything is bound", async () => {
    const port = await freePort();
    await expect(start({ config: { ...bus.config, http: { host: "0.0.0.0", port } } })).rejects.toThrow(new ConfigError(REFUSED));
    await expect(start({ config: { ...bus.config, http: { host: "::", port } } })).rejects.toThrow(
      /^HTTP_HOST :: is not a loopback address/,
    );
    // Nothing listens on the port, and no endpoint of the seat's service answers.
    await expect(fetch(`http://127.0.0.1:${port}/healthz`)).rejects.toThrow();
    await expect(seat.request("$SRV.PING.mesh-provisioner", "", { timeout: 2000 })).rejects.toMatchObject({ code: "503" });
  });

  it("stops `mesh-provisioner start` with exit code 1 and the reason", { timeout: 20_000 }, async () => {
    const { child, said, exited } = startCli({ HTTP_HOST: "0.0.0.0" });
    try {
      expect(await Promise.race([exited, new Promise((r) => setTimeout(r, 15_000, "still running"))])).toBe(1);
      expect(said.stderr).toBe(`mesh-provisioner: ${REFUSED}\n`);
    } finally {
      child.kill("SIGKILL"); // one that started after all
    }
  });

  it("starts on 0.0.0.0 with a token, and without one when the network is said trusted", async () => {
    const guarded = await start({ config: { ...bus.config, http: { host: "0.0.0.0", port: 0, token: TOKEN } } });
    try {
      const { port } = new URL(guarded.httpUrl);
      expect(guarded.httpUrl).toBe(`http://0.0.0.0:${port}`);
      expect((await fetch(`http://127.0.0.1:${port}/status`)).status).toBe(401);
      expect((await fetch(`http://127.0.0.1:${port}/status`, bearer(TOKEN))).status).toBe(200);
    } finally {
      await guarded.stop();
    }
    const trusted = await start({ config: { ...bus.config, http: { host: "0.0.0.0", port: 0, trustedNetwork: true } } });
    try {
      const { port } = new URL(trusted.httpUrl);
      expect((await fetch(`http://127.0.0.1:${port}/status`)).status).toBe(200);
    } finally {
      await trusted.stop();
    }
  });

  it("counts 127.0.0.0/8, ::1 and localhost as loopback, and nothing else", () => {
    for (const host of ["127.0.0.1", "127.8.9.10", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "localhost", "LOCALHOST"]) {
      expect(isLoopback(host), host).toBe(true);
    }
    for (const host of ["0.0.0.0", "::", "10.0.0.1", "192.168.1.2", "128.0.0.1", "fe80::1", "example.org", "localhost.example.org"]) {
      expect(isLoopback(host), host).toBe(false);
    }
  });
});

describe("the token and the trusted network in the config and the environment", () => {
  const base = { seat: "s", buckets: { b: { bucket: "b", writtenBy: "seat" } } };
  const refusal = (raw: unknown, env: NodeJS.ProcessEnv) => {
    try {
      resolveConfig(raw, CONFIG, env);
      return "accepted";
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      return (err as Error).message;
    }
  };

  it("takes HTTP_TOKEN and HTTP_TRUSTED_NETWORK over the file's http block", () => {
    const raw = { ...base, http: { token: "a-token-of-the-file-0123", trustedNetwork: true } };
    expect(resolveConfig(raw, CONFIG, {}).http).toEqual({
      host: "127.0.0.1",
      port: 8787,
      token: "a-token-of-the-file-0123",
      trustedNetwork: true,
    });
    const env = { HTTP_HOST: "0.0.0.0", HTTP_TOKEN: TOKEN, HTTP_TRUSTED_NETWORK: "0" };
    expect(resolveConfig(raw, CONFIG, env).http).toEqual({ host: "0.0.0.0", port: 8787, token: TOKEN, trustedNetwork: false });
    expect(resolveConfig(base, CONFIG, { HTTP_TRUSTED_NETWORK: "1" }).http.trustedNetwork).toBe(true);
    expect(resolveConfig(base, CONFIG, { HTTP_TRUSTED_NETWORK: "true" }).http.trustedNetwork).toBe(true);
  });

  it("refuses a flag that is not one, and a token too short or not a bearer token, without saying it", () => {
    expect(refusal(base, { HTTP_TRUSTED_NETWORK: "yes" })).toBe(
      "environment: HTTP_TRUSTED_NETWORK: must be 1 or true (the network is trusted), 0 or false",
    );
    expect(refusal(base, { HTTP_TOKEN: "short-secret" })).toBe(
      "environment: HTTP_TOKEN: must be at least 16 characters (e.g. `openssl rand -hex 32`)",
    );
    expect(refusal({ ...base, http: { token: "a token with spaces in it" } }, {})).toBe(
      "wrangler-free.config.ts: http.token: must be letters, digits and . _ ~ + / - (then = only), as a bearer token is",
    );
  });

  it("takes HTTP_PORT as digits only: an empty one is refused, not read as 0 (a free port)", () => {
    expect(resolveConfig(base, CONFIG, { HTTP_PORT: "0" }).http.port).toBe(0);
    expect(resolveConfig(base, CONFIG, { HTTP_PORT: "9090" }).http.port).toBe(9090);
    const port = "environment: HTTP_PORT: must be a port number, 0 to 65535 (0 picks a free one)";
    for (const given of ["", " ", "80x", "-1", "1e3", "65536"])
      expect(refusal(base, { HTTP_PORT: given }), JSON.stringify(given)).toBe(port);
    expect(resolveConfig(base, CONFIG, { NATS_REPLICAS: "3" }).replicas).toBe(3);
    for (const given of ["", "2", "three"]) {
      expect(refusal(base, { NATS_REPLICAS: given }), JSON.stringify(given)).toBe("environment: NATS_REPLICAS: must be 1, 3 or 5");
    }
  });
});

describe("a set with a token", () => {
  let set: Running;
  beforeAll(async () => {
    set = await startSet(bus, { http: { host: "127.0.0.1", port: 0, token: TOKEN } });
  });
  afterAll(async () => {
    await set.stop();
  });

  const GUARDED = ["/provisioning?what=registry&kind=port", "/status", "/metrics", "/no-such-route"];

  it("refuses every route but /healthz and /readyz without the token or with another, with a 401 and the refusal's body", async () => {
    for (const path of GUARDED) {
      const none = await fetch(`${set.httpUrl}${path}`);
      expect([path, none.status]).toEqual([path, 401]);
      expect(none.headers.get("content-type")).toBe("application/json");
      expect(none.headers.get("www-authenticate")).toBe('Bearer realm=""');
      expect(await none.json()).toEqual({
        error: { code: 401, message: "this route asks for the bearer token HTTP_TOKEN sets: send Authorization: Bearer <token>" },
      });
      const wrong = await fetch(`${set.httpUrl}${path}`, bearer("another-token-0123456789abcdef"));
      expect([path, wrong.status]).toEqual([path, 401]);
      expect(wrong.headers.get("www-authenticate")).toBe('Bearer error="invalid_token"');
      expect(await wrong.json()).toEqual({ error: { code: 401, message: "the bearer token is not the one HTTP_TOKEN sets" } });
    }
    // A token that only starts like the right one is another.
    expect((await fetch(`${set.httpUrl}/status`, bearer(TOKEN.slice(0, -1)))).status).toBe(401);
    const basic = await fetch(`${set.httpUrl}/status`, { headers: { authorization: "Basic dXNlcjpwYXNz" } });
    expect(basic.status).toBe(400);
    expect(await basic.json()).toEqual({ error: { code: 400, message: 'the Authorization header is not "Bearer <token>"' } });
  });

  it("answers with the token", async () => {
    const registry = await fetch(`${set.httpUrl}/provisioning?what=registry&kind=port`, bearer(TOKEN));
    expect(registry.status).toBe(200);
    expect(((await registry.json()) as { entries: { key: string }[] }).entries.map((e) => e.key)).toEqual(["port"]);
    const status = await fetch(`${set.httpUrl}/status`, bearer(TOKEN));
    expect(status.status).toBe(200);
    expect(await status.json()).toMatchObject({ well: true, failing: [] });
    const metrics = await fetch(`${set.httpUrl}/metrics`, bearer(TOKEN));
    expect(metrics.status).toBe(200);
    expect(await metrics.text()).toMatch(/^nats_connected 1$/m);
    // An unknown route is still a 404 once the token is right.
    expect((await fetch(`${set.httpUrl}/no-such-route`, bearer(TOKEN))).status).toBe(404);
  });

  it("leaves /healthz and /readyz open, with a token or without", async () => {
    for (const init of [{}, bearer("another-token-0123456789abcdef")]) {
      const health = await fetch(`${set.httpUrl}/healthz`, init);
      expect([health.status, await health.json()]).toEqual([200, { ok: true }]);
      const ready = await fetch(`${set.httpUrl}/readyz`, init);
      expect([ready.status, await ready.json()]).toEqual([200, { ready: true }]);
    }
  });

  it("is taken from HTTP_TOKEN by `mesh-provisioner start` on 0.0.0.0, and never logged", async () => {
    const { child, said, exited } = startCli({ HTTP_HOST: "0.0.0.0", HTTP_TOKEN: TOKEN, LOG_LEVEL: "trace" });
    try {
      await until(() => /\n {2}status .*\n/.test(said.stderr), 30_000, "the banner");
      const port = /^HTTP {2}http:\/\/0\.0\.0\.0:(\d+)$/m.exec(said.stderr)![1]!;
      const url = `http://127.0.0.1:${port}`;
      expect((await fetch(`${url}/status`)).status).toBe(401);
      expect((await fetch(`${url}/status`, bearer(`${TOKEN}x`))).status).toBe(401);
      expect((await fetch(`${url}/status`, bearer(TOKEN))).status).toBe(200);
      expect((await fetch(`${url}/readyz`)).status).toBe(200);
    } finally {
      child.kill("SIGTERM");
    }
    expect(await exited).toBe(0);
    expect(said.stdout).toMatch(/"msg":"started"/);
    expect(said.stdout + said.stderr).not.toContain(TOKEN);
  });
});

describe("status by its HTTP code", () => {
  let set: Running;
  beforeAll(async () => {
    set = await startSet(bus);
  });
  afterAll(async () => {
    await set.stop();
  });

  const status = async (query = "") => {
    const response = await fetch(`${set.httpUrl}/status${query}`);
    return { code: response.status, body: (await response.json()) as { well: boolean; failing: { provider: string }[] } };
  };

  it("is 503 with the answer while a provider fails, and 200 once it recovered", async () => {
    expect(await status()).toMatchObject({ code: 200, body: { well: true, failing: [] } });
    const keycloak = (await bus.connect("keycloak")).jetstream();
    const failedAt = new Date(Date.now() - 10_000).toISOString();
    await keycloak.publish(
      "keycloak.provisioner.failing",
      JSON.stringify({ machine: "birch", consumer: "caddy", word: "issuer unreachable", at: failedAt }),
    );
    await until(async () => (await status()).code === 503, 10_000, "status 503");
    expect(await status()).toMatchObject({
      code: 503,
      body: { well: false, failing: [{ provider: "keycloak", machine: "birch", consumer: "caddy", word: "issuer unreachable" }] },
    });
    // Narrowed, the code speaks of what the narrowing reaches.
    expect(await status("?provider=postgres")).toMatchObject({ code: 200, body: { well: true, failing: [] } });
    expect((await status("?provider=keycloak")).code).toBe(503);
    // Over NATS, not well is an answer, not a refusal.
    const reply = await request(seat, STATUS, {});
    expect([reply.errorCode, reply.body.well]).toEqual([undefined, false]);

    await keycloak.publish(
      "keycloak.provisioner.recovered",
      JSON.stringify({ machine: "birch", consumer: "caddy", at: new Date().toISOString() }),
    );
    await until(async () => (await status()).code === 200, 10_000, "status 200 again");
    expect(await status()).toMatchObject({ code: 200, body: { well: true, failing: [] } });
  });

  it("is still a refusal's code when the request is refused", async () => {
    const refused = await fetch(`${set.httpUrl}/status?provider=two%20words`);
    expect(refused.status).toBe(400);
    expect(((await refused.json()) as { error: { code: number } }).error.code).toBe(400);
  });
});
