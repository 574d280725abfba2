/**
 * The connection to the bus: the configured servers with the seat's credentials (a creds file, an
 * nkey seed, a user and password, a token, or those written in a URL; TLS files), or the
 * embedded server of the state folder, found running or started with the users given. Secrets
 * are read only from files their owner alone may read, and never shown (docs/runtime.md §6.7).
 */
import { readFileSync, statSync } from "node:fs";
import { connect, credsAuthenticator, nkeyAuthenticator, type ConnectionOptions, type NatsConnection } from "nats";
import { configPath, NATS_FILE_VARIABLES, type Config, type NatsFileNames } from "./config.ts";
import { findEmbedded, startEmbedded, type EmbeddedServer } from "./embedded.ts";
import { inboxOf, type AuthorizedUser, type Credentials } from "./users.ts";

/** A connection to the bus, and the embedded server behind it when this process started one. */
export interface Session {
  readonly nc: NatsConnection;
  readonly url: string;
  readonly embedded?: EmbeddedServer;
  /** Drains the connection, then stops the embedded server if this session started it. */
  close(): Promise<void>;
}

/**
 * Reads a secret file (credentials, nkey seed, TLS key), refusing one that others than its owner
 * may read or write: a secret kept like that is no longer the seat's alone.
 */
function readSecret(what: string, file: string): Buffer {
  let mode: number;
  try {
    const stat = statSync(file);
    if (!stat.isFile()) throw new Error("it is not a file");
    mode = stat.mode;
  } catch (err) {
    throw new Error(`${what} ${file} cannot be read: ${(err as Error).message}`, { cause: err });
  }
  if ((mode & 0o077) !== 0) {
    throw new Error(`${what} ${file} is open to others than its owner (mode ${(mode & 0o777).toString(8)}): run chmod 600 ${file}`);
  }
  try {
    return readFileSync(file);
  } catch (err) {
    throw new Error(`${what} ${file} cannot be read: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * The nats.js options for the credentials of `config.nats` (docs/runtime.md §6): a creds file (JWT +
 * nkey), an nkey seed file, a user and password, or a token, else those written in a server URL;
 * and TLS files when set (a CA to trust the server, a client certificate and key when the
 * server asks for one). Throws naming the file it cannot read, or a secret file others may read,
 * and where it was named (`namedBy`: its variable, or the config file's field).
 */
export function credentialOptions(nats: Config["nats"], namedBy: NatsFileNames = NATS_FILE_VARIABLES): Partial<ConnectionOptions> {
  const tls =
    nats.tls === undefined
      ? {}
      : {
          tls: {
            ...(nats.tls.ca ? { caFile: readable(namedBy.ca, nats.tls.ca) } : {}),
            ...(nats.tls.cert ? { certFile: readable(namedBy.cert, nats.tls.cert) } : {}),
            ...(nats.tls.key ? { key: readSecret(namedBy.key, nats.tls.key).toString() } : {}),
          },
        };
  if (nats.creds) return { ...tls, authenticator: credsAuthenticator(new Uint8Array(readSecret(namedBy.creds, nats.creds))) };
  if (nats.nkey) {
    const seed = new Uint8Array(readSecret(namedBy.nkey, nats.nkey)).filter((b) => b > 32);
    return { ...tls, authenticator: nkeyAuthenticator(seed) };
  }
  if (nats.user) return { ...tls, user: nats.user, pass: nats.password ?? "" };
  if (nats.token) return { ...tls, token: nats.token };
  return { ...tls, ...urlCredentials(nats.servers) };
}

/**
 * The credentials written in the first server URL that has some, as the nats CLI reads them:
 * `nats://user:password@host` a user and password, `nats://token@host` a token (both
 * percent-decoded). nats.js itself ignores them.
 */
function urlCredentials(servers: readonly string[]): Partial<ConnectionOptions> {
  for (const server of servers) {
    const { userinfo } = splitUrl(server);
    if (userinfo === undefined || userinfo === "") continue;
    const decoded = (text: string) => {
      try {
        return decodeURIComponent(text);
      } catch {
        return text; // not percent-encoded after all
      }
    };
    const colon = userinfo.indexOf(":");
    if (colon === -1) return { token: decoded(userinfo) };
    return { user: decoded(userinfo.slice(0, colon)), pass: decoded(userinfo.slice(colon + 1)) };
  }
  return {};
}

function readable(what: string, file: string): string {
  try {
    if (!statSync(file).isFile()) throw new Error("it is not a file");
    readFileSync(file);
  } catch (err) {
    throw new Error(`${what} ${file} cannot be read: ${(err as Error).message}`, { cause: err });
  }
  return file;
}

/**
 * A server URL split at its credentials: the scheme with its `//` (or nothing), what comes
 * before the last `@` (a user, password or token, which may hold `/`, `:` and `@` themselves),
 * and the rest.
 */
function splitUrl(url: string): { scheme: string; userinfo?: string; rest: string } {
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(url)?.[0] ?? "";
  const after = url.slice(scheme.length);
  const at = after.lastIndexOf("@");
  return at === -1 ? { scheme, rest: after } : { scheme, userinfo: after.slice(0, at), rest: after.slice(at + 1) };
}

/** A server URL as it may be shown: a user, password or token in it replaced by `***`. */
export function withoutPassword(url: string): string {
  const { scheme, userinfo, rest } = splitUrl(url);
  return userinfo === undefined ? url : `${scheme}***@${rest}`;
}

/** How often the connection pings its server, in milliseconds; two pings unanswered and it reconnects. */
export const PING_MS = 5000;

/**
 * Connects to `servers` (5 s for the first connection, then reconnecting for ever), with replies
 * on `_INBOX.<user>` (the user's own inbox, {@link inboxOf}) unless `inboxPrefix` says. Throws,
 * naming the servers and the server's reason, when the first connection fails; refused
 * credentials are said as such.
 */
export async function connectTo(servers: readonly string[], options: Partial<ConnectionOptions>): Promise<NatsConnection> {
  try {
    const inboxPrefix = options.user ? inboxOf(options.user) : "_INBOX";
    // Credentials written in a URL are in `options` already (credentialOptions): nats.js never sees them.
    const bare = servers.map((server) => {
      const { scheme, rest } = splitUrl(server);
      return scheme + rest;
    });
    // No async stack traces: they cost an Error per request, and errors are logged by message.
    // Credentials refused while reconnecting (a server restarting, being reconfigured) are
    // tried again like any failure, not the end of the connection.
    return await connect({
      servers: bare,
      name: options.name,
      maxReconnectAttempts: -1,
      timeout: 5000,
      inboxPrefix,
      noAsyncTraces: true,
      ignoreAuthErrorAbort: true,
      // A hung server is noticed within seconds (nats.js's default waits 2 minutes, twice).
      pingInterval: PING_MS,
      maxPingOut: 2,
      ...options,
    });
  } catch (err) {
    const { code, message } = err as { code?: string; message: string };
    const reason =
      code === "BAD_CREDS"
        ? "the creds file is not a NATS creds file (a user JWT and its nkey seed)"
        : code === "AUTHORIZATION_VIOLATION"
          ? options.user !== undefined
            ? `the server refused the credentials of user ${options.user} (check NATS_USER and NATS_PASSWORD, or NATS_CREDS, NATS_NKEY, NATS_TOKEN)`
            : options.token === undefined && options.authenticator === undefined
              ? "the server asks for credentials and none were given: set NATS_USER and NATS_PASSWORD (the seat's), or NATS_CREDS, NATS_NKEY or NATS_TOKEN"
              : "the server refused the credentials (check NATS_CREDS, NATS_NKEY, NATS_USER and NATS_PASSWORD, or NATS_TOKEN)"
          : code === "TIMEOUT"
            ? "no connection within 5 s (is the URL right? does the server want TLS: NATS_CA, NATS_CERT, NATS_KEY?)"
            : message;
    throw new Error(`cannot connect to ${servers.map(withoutPassword).join(", ")}: ${reason}`, { cause: err });
  }
}

/** Drains `nc`, unless it is closed already. */
const drained = async (nc: NatsConnection): Promise<void> => {
  if (!nc.isClosed()) await nc.drain();
};

export interface SessionOptions {
  /**
   * With no server configured: `start` the embedded server of the state folder, `join` the one
   * running (another process started it), or join it when it runs and start it otherwise.
   */
  readonly embedded: "start" | "join" | "join-or-start";
  /** On the embedded server: the user to connect as; the seat by default. */
  readonly user?: string;
  /** The connection's name, as the server shows it. */
  readonly name?: string;
  /** The embedded server's `max_payload`, in bytes. */
  readonly maxPayload?: number;
  /**
   * The embedded server's users with their permissions (the seat first), when it is started
   * here: see `authorization` of `permissions.ts`.
   */
  readonly users?: readonly AuthorizedUser[];
}

/**
 * Opens the bus for the config: the configured servers with the configured credentials; else
 * the embedded server of the config's state folder, found running or started here with
 * `options.users`. Throws when none can be reached, or when the embedded server is to be started
 * and no users are given.
 */
export async function openSession(config: Config, options: SessionOptions): Promise<Session> {
  const name = options.name ?? config.seat;
  if (config.nats.servers.length > 0) {
    // Replies come to the user's own inbox; with creds, an nkey or a token, the seat's.
    const credentials = credentialOptions(config.nats, config.namedBy);
    const inboxPrefix = inboxOf(credentials.user ?? config.seat);
    const nc = await connectTo(config.nats.servers, { name, inboxPrefix, ...credentials });
    return { nc, url: config.nats.servers.map(withoutPassword).join(","), close: () => drained(nc) };
  }
  const stateDir = configPath(config, config.state);
  const user = options.user ?? config.seat;
  const running = options.embedded === "start" ? undefined : findEmbedded(stateDir);
  if (options.embedded === "join" || running !== undefined) {
    const credentials = running?.users[user];
    if (running === undefined) {
      throw new Error(`no NATS_URL is set and no embedded nats-server runs for ${stateDir}: start one with \`npm start\``);
    }
    if (credentials === undefined) throw new Error(`the embedded nats-server has no user ${user}`);
    const nc = await connectTo([running.url], { name, user: credentials.user, pass: credentials.password });
    return { nc, url: running.url, close: () => drained(nc) };
  }
  if (options.users === undefined)
    throw new Error(`no NATS_URL is set and no users are given to start the embedded nats-server of ${stateDir}`);
  const embedded = await startEmbedded({ stateDir, users: options.users, maxPayload: options.maxPayload });
  try {
    const as: Credentials | undefined = user === config.seat ? embedded.seat : embedded.users[user];
    if (as === undefined) throw new Error(`the embedded server has no user ${user}`);
    const nc = await connectTo([embedded.url], { name, user: as.user, pass: as.password });
    return {
      nc,
      url: embedded.url,
      embedded,
      close: async () => {
        await drained(nc).catch(() => {});
        await embedded.stop();
      },
    };
  } catch (err) {
    await embedded.stop();
    throw err;
  }
}
