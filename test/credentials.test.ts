import { execFileSync } from "node:child_process";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { createHash } from "node:crypto";
import { connect, credsAuthenticator, nkeys, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { VERB } from "../functions/_lib/provisioning.ts";
import { loadFunctions, resolveConfig, start, type Config } from "../runtime/index.ts";
import { spawnNatsServer, type RunningNatsServer } from "../runtime/nats-server.ts";
import { authorization } from "../runtime/permissions.ts";
import type { AuthorizedUser } from "../runtime/users.ts";
import { projectConfig, request } from "./helpers.ts";

type KeyPair = ReturnType<typeof nkeys.createUser>;

let dir: string;
let base: Config;
let users: AuthorizedUser[];
const servers: RunningNatsServer[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-credentials-"));
  base = await projectConfig();
  users = authorization(base, await loadFunctions(base), { nodes: ["alder"], providers: [] });
});
afterAll(async () => {
  for (const server of servers) await server.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** A nats-server with JetStream and the given `authorization` (and `tls`), in its own folder. */
async function server(name: string, conf: Record<string, unknown>): Promise<RunningNatsServer> {
  const store = join(dir, name);
  const running = await spawnNatsServer({ conf: { jetstream: { store_dir: store }, ...conf }, confFile: join(dir, `${name}.conf`) });
  servers.push(running);
  return running;
}

/** The project's config pointed at `url` with the environment `env`, HTTP on a free port. */
const configWith = (url: string, env: NodeJS.ProcessEnv): Config => ({
  ...resolveConfig({ ...base, nats: { servers: [] }, http: { port: 0 } }, base.file, { NATS_URL: url, ...env }),
  root: base.root,
});

/** A file holding `text`, with `mode`. */
function file(name: string, text: string, mode = 0o600): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  chmodSync(path, mode);
  return path;
}

/** Starts the set, asks the verb as node `alder`, stops: the registry's kinds, or the error. */
async function serves(config: Config, asNode: () => Promise<NatsConnection>): Promise<number | string> {
  const set = await start({ config }).catch((e: Error) => e);
  if (set instanceof Error) return set.message;
  try {
    const nc = await asNode();
    const reply = await request(nc, VERB, {});
    await nc.close();
    return reply.body.entries.length;
  } finally {
    await set.stop();
  }
}

const seat = () => users.find((u) => u.role === "seat")!;
const alder = () => users.find((u) => u.user === "alder")!;

/**
 * Operator-mode (JWT) credentials, as `nsc` would make them: an operator, an account with
 * JetStream, and users whose JWTs carry their permissions. Each JWT is signed with its issuer's
 * nkey (header, claims, signature; base64url; `jti` the base32 SHA-256 of the claims).
 */
function operatorMode() {
  const b64 = (data: Uint8Array | string) => Buffer.from(data).toString("base64url");
  const base32 = (bytes: Buffer) => {
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let out = "";
    let bits = 0;
    let value = 0;
    for (const byte of bytes) {
      value = (value << 8) | byte;
      bits += 8;
      for (; bits >= 5; bits -= 5) out += alphabet[(value >>> (bits - 5)) & 31];
    }
    return bits > 0 ? out + alphabet[(value << (5 - bits)) & 31] : out;
  };
  const pub = (key: KeyPair) => key.getPublicKey() as unknown as string;
  const sign = (issuer: KeyPair, subject: string, name: string, nats: Record<string, unknown>) => {
    const header = b64(JSON.stringify({ typ: "JWT", alg: "ed25519-nkey" }));
    const claims: Record<string, unknown> = {
      iat: Math.floor(Date.now() / 1000),
      iss: pub(issuer),
      name,
      sub: subject,
      nats: { version: 2, ...nats },
    };
    claims.jti = base32(createHash("sha256").update(JSON.stringify(claims)).digest());
    const body = b64(JSON.stringify(claims));
    return `${header}.${body}.${b64(issuer.sign(new TextEncoder().encode(`${header}.${body}`)))}`;
  };
  const unlimited = { subs: -1, conn: -1, leaf: -1, imports: -1, exports: -1, data: -1, payload: -1, wildcards: true };
  const operator = nkeys.createOperator();
  const account = nkeys.createAccount();
  const system = nkeys.createAccount();
  const conf = [
    `operator: ${sign(operator, pub(operator), "mesh", { type: "operator", system_account: pub(system) })}`,
    `system_account: ${pub(system)}`,
    "resolver: MEMORY",
    "resolver_preload: {",
    `  ${pub(account)}: ${sign(operator, pub(account), "mesh", { type: "account", limits: { ...unlimited, mem_storage: -1, disk_storage: -1, streams: -1, consumer: -1 } })}`,
    `  ${pub(system)}: ${sign(operator, pub(system), "SYS", { type: "account", limits: unlimited })}`,
    "}",
  ].join("\n");
  /** A creds file's text for a user of the account with `permissions`. */
  const creds = (name: string, permissions: AuthorizedUser["permissions"]) => {
    const user = nkeys.createUser();
    const jwt = sign(account, pub(user), name, {
      type: "user",
      pub: permissions.publish,
      sub: permissions.subscribe,
      subs: -1,
      data: -1,
      payload: -1,
    });
    const seed = new TextDecoder().decode(user.getSeed());
    return `-----BEGIN NATS USER JWT-----\n${jwt}\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n${seed}\n------END USER NKEY SEED------\n`;
  };
  return { conf, creds };
}

describe("credentials", () => {
  it("connects with a creds file on a server in operator (JWT) mode, under the derived permissions", async () => {
    const { conf, creds } = operatorMode();
    const store = join(dir, "operator-store");
    // The seat's JWT carries its ~70 subjects: its CONNECT line is longer than the default 4 KiB.
    const bus = await spawnNatsServer({
      conf: `${conf}\njetstream { store_dir: ${JSON.stringify(store)} }\nmax_control_line: 16384`,
      confFile: join(dir, "operator.conf"),
    });
    servers.push(bus);
    const seatCreds = file("seat.creds", creds("mesh-provisioner", seat().permissions));
    const alderCreds = creds("alder", alder().permissions);
    const asAlder = () =>
      connect({ servers: bus.url, authenticator: credsAuthenticator(new TextEncoder().encode(alderCreds)), inboxPrefix: "_INBOX.alder" });
    expect(await serves(configWith(bus.url, { NATS_CREDS: seatCreds }), asAlder)).toBe(13);
  });

  it("connects with an nkey seed file, and refuses one that others may read", async () => {
    const user = nkeys.createUser();
    const bus = await server("nkey", {
      authorization: {
        users: [
          { nkey: user.getPublicKey(), permissions: seat().permissions },
          { user: "alder", password: "alder-pw", permissions: alder().permissions },
        ],
      },
    });
    const seed = file("seat.nk", new TextDecoder().decode(user.getSeed()));
    const asAlder = () => connect({ servers: bus.url, user: "alder", pass: "alder-pw", inboxPrefix: "_INBOX.alder" });
    expect(await serves(configWith(bus.url, { NATS_NKEY: seed }), asAlder)).toBe(13);
    chmodSync(seed, 0o644);
    expect(await serves(configWith(bus.url, { NATS_NKEY: seed }), asAlder)).toBe(
      `NATS_NKEY ${seed} is open to others than its owner (mode 644): run chmod 600 ${seed}`,
    );
  });

  it("refuses a creds file that others may read, before reading it", async () => {
    const creds = file("seat.creds", "not even a creds file", 0o640);
    expect(await serves(configWith("nats://127.0.0.1:1", { NATS_CREDS: creds }), () => Promise.reject(new Error("unused")))).toBe(
      `NATS_CREDS ${creds} is open to others than its owner (mode 640): run chmod 600 ${creds}`,
    );
  });

  it("connects with a token", async () => {
    const bus = await server("token", { authorization: { token: "s3cret-token" } });
    expect(
      await serves(configWith(bus.url, { NATS_TOKEN: "s3cret-token" }), () => connect({ servers: bus.url, token: "s3cret-token" })),
    ).toBe(13);
  });

  it("says a refused connection plainly", async () => {
    const bus = await server("refusing", {
      authorization: { users: [{ user: "mesh-provisioner", password: "right", permissions: seat().permissions }] },
    });
    const refused = await serves(configWith(bus.url, { NATS_USER: "mesh-provisioner", NATS_PASSWORD: "wrong" }), () =>
      Promise.reject(new Error("unused")),
    );
    expect(refused).toBe(
      `cannot connect to ${bus.url}: the server refused the credentials of user mesh-provisioner (check NATS_USER and NATS_PASSWORD, or NATS_CREDS, NATS_NKEY, NATS_TOKEN)`,
    );
    // None given to a server that asks for some: said so, naming what to set.
    const none = await serves(configWith(bus.url, {}), () => Promise.reject(new Error("unused")));
    expect(none).toBe(
      `cannot connect to ${bus.url}: the server asks for credentials and none were given: set NATS_USER and NATS_PASSWORD (the seat's), or NATS_CREDS, NATS_NKEY or NATS_TOKEN`,
    );
  });

  it("connects over TLS with a CA, a client certificate and key, and fails plainly without them", async () => {
    const openssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA");
    for (const [name, extra] of [
      ["server", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
      ["client", "extendedKeyUsage=clientAuth"],
    ] as const) {
      openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
      writeFileSync(join(dir, `${name}.ext`), `${extra}\n`);
      openssl(
        "x509",
        "-req",
        "-in",
        `${name}.csr`,
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        `${name}.pem`,
        "-days",
        "2",
        "-extfile",
        `${name}.ext`,
      );
      chmodSync(join(dir, `${name}.key`), 0o600);
    }
    const bus = await server("tls", {
      tls: { cert_file: join(dir, "server.pem"), key_file: join(dir, "server.key"), ca_file: join(dir, "ca.pem"), verify: true },
      authorization: {
        users: [
          { user: "mesh-provisioner", password: "seat-pw", permissions: seat().permissions },
          { user: "alder", password: "alder-pw", permissions: alder().permissions },
        ],
      },
    });
    const tls = { caFile: join(dir, "ca.pem"), certFile: join(dir, "client.pem"), keyFile: join(dir, "client.key") };
    const env = {
      NATS_USER: "mesh-provisioner",
      NATS_PASSWORD: "seat-pw",
      NATS_CA: tls.caFile,
      NATS_CERT: tls.certFile,
      NATS_KEY: tls.keyFile,
    };
    expect(
      await serves(configWith(bus.url, env), () =>
        connect({ servers: bus.url, user: "alder", pass: "alder-pw", tls, inboxPrefix: "_INBOX.alder" }),
      ),
    ).toBe(13);
    const withoutCert = await serves(
      configWith(bus.url, { NATS_USER: "mesh-provisioner", NATS_PASSWORD: "seat-pw", NATS_CA: tls.caFile }),
      () => Promise.reject(new Error("unused")),
    );
    expect(withoutCert).toBe(
      `cannot connect to ${bus.url}: no connection within 5 s (is the URL right? does the server want TLS: NATS_CA, NATS_CERT, NATS_KEY?)`,
    );
  });
});

describe("credential mistakes, said plainly", () => {
  it("names the variable and file of a folder or a file that is no creds file, and hides passwords in URLs", async () => {
    const folder = join(dir, "a-folder");
    execFileSync("mkdir", ["-p", folder]);
    expect(await serves(configWith("nats://127.0.0.1:1", { NATS_NKEY: folder }), () => Promise.reject(new Error("unused")))).toBe(
      `NATS_NKEY ${folder} cannot be read: it is not a file`,
    );
    const bus = await server("creds-check", { authorization: { token: "t" } });
    const garbage = file("garbage.creds", "not a creds file");
    expect(await serves(configWith(bus.url, { NATS_CREDS: garbage }), () => Promise.reject(new Error("unused")))).toBe(
      `cannot connect to ${bus.url}: the creds file is not a NATS creds file (a user JWT and its nkey seed)`,
    );
    const withPassword = bus.url.replace("nats://", "nats://seat:hunter2@");
    const refused = await serves(configWith(withPassword, {}), () => Promise.reject(new Error("unused")));
    expect(refused).toMatch(/^cannot connect to nats:\/\/\*\*\*@127\.0\.0\.1:\d+: /);
    expect(() => configWith("nats://x", { NATS_URL: " , ," })).toThrow('environment: NATS_URL: holds no server URL (" , ,")');
  });

  it("takes a file the config file names from the config file's folder, and one a variable names from the working folder", () => {
    const { root: _root, file: _file, ...raw } = base;
    const nats = { servers: [], creds: "secrets/seat.creds", tls: { ca: "../ca.pem", cert: "/etc/tls/client.pem", key: "client.key" } };
    const config = resolveConfig({ ...raw, nats }, "/srv/mesh/mesh.config.ts", {});
    expect([config.nats.creds, config.nats.tls]).toEqual([
      "/srv/mesh/secrets/seat.creds",
      { ca: "/srv/ca.pem", cert: "/etc/tls/client.pem", key: "/srv/mesh/client.key" },
    ]);
    const nkey = resolveConfig({ ...raw, nats: { servers: [], nkey: "seat.nk" } }, "/srv/mesh/mesh.config.ts", {});
    expect(nkey.nats.nkey).toBe("/srv/mesh/seat.nk");
    const env = { NATS_CREDS: "here.creds", NATS_CA: "ca.pem" };
    const given = resolveConfig({ ...raw, nats }, "/srv/mesh/mesh.config.ts", env);
    expect([given.nats.creds, given.nats.tls?.ca, given.nats.tls?.key]).toEqual(["here.creds", "ca.pem", "/srv/mesh/client.key"]);
    // Each error about one of them names where it was named: the variable, or the config file's field.
    // The config file as every config error shows it: from the working folder.
    const shown = relative(process.cwd(), "/srv/mesh/mesh.config.ts");
    expect(given.namedBy).toEqual({
      creds: "NATS_CREDS",
      nkey: "NATS_NKEY",
      ca: "NATS_CA",
      cert: `nats.tls.cert in ${shown}`,
      key: `nats.tls.key in ${shown}`,
    });
  });

  it("names the config file's field, not a variable, for a file the config file names that cannot be read", async () => {
    const { root: _root, file: _file, ...raw } = base;
    const configFile = join(dir, "named.config.ts");
    const config = resolveConfig(
      { ...raw, nats: { servers: ["nats://127.0.0.1:1"], nkey: "missing.nk" }, http: { port: 0 } },
      configFile,
      {},
    );
    const shown = relative(process.cwd(), configFile);
    expect(await serves({ ...config, root: base.root }, () => Promise.reject(new Error("unused")))).toMatch(
      new RegExp(
        `^nats\\.nkey in ${shown.replace(/[.]/g, "\\.")} ${join(dir, "missing.nk").replace(/[.]/g, "\\.")} cannot be read: ENOENT`,
      ),
    );
  });
});
