import { readFileSync } from "node:fs";
import { connect, credsAuthenticator, nkeyAuthenticator, type ConnectionOptions, type NatsConnection } from "nats";
import { configPath, type Config } from "./config.ts";
import { findEmbedded, startEmbedded, type Credentials, type EmbeddedServer } from "./embedded.ts";
import { loadFunctions, type LoadedFunction } from "./loader.ts";
import { authorization } from "./permissions.ts";

/** A connection to the bus, and the embedded server behind it when this process started one. */
export interface Session {
  readonly nc: NatsConnection;
  readonly url: string;
  readonly embedded?: EmbeddedServer;
  /** Drains the connection, then stops the embedded server if this session started it. */
  close(): Promise<void>;
}

/**
 * The nats.js options for the credentials of `config.nats`: a creds file (JWT + nkey), an nkey
 * seed file, a user and password, or a token (SPEC §6). Throws naming the file it cannot read.
 */
export function credentialOptions(nats: Config["nats"]): Partial<ConnectionOptions> {
  const read = (what: string, file: string) => {
    try {
      return readFileSync(file);
    } catch (err) {
      throw new Error(`${what} ${file} cannot be read: ${(err as Error).message}`);
    }
  };
  if (nats.creds) return { authenticator: credsAuthenticator(read("NATS_CREDS", nats.creds)) };
  if (nats.nkey) return { authenticator: nkeyAuthenticator(new Uint8Array(read("NATS_NKEY", nats.nkey)).filter((b) => b > 32)) };
  if (nats.user) return { user: nats.user, pass: nats.password ?? "" };
  if (nats.token) return { token: nats.token };
  return {};
}

/** Connects to `servers`, naming them and the server's reason when the connection is refused. */
export async function connectTo(servers: readonly string[], options: Partial<ConnectionOptions>): Promise<NatsConnection> {
  try {
    return await connect({ servers: [...servers], name: options.name, maxReconnectAttempts: -1, ...options });
  } catch (err) {
    throw new Error(`cannot connect to ${servers.join(", ")}: ${(err as Error).message}`);
  }
}

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
  /** The function set whose permissions the embedded server grants; the config's by default. */
  readonly functions?: readonly LoadedFunction[];
}

/**
 * Opens the bus for the config: the configured servers with the configured credentials; else
 * the embedded server of the config's state folder, found running or started here with the
 * seat's, nodes' and providers' permissions derived from the function set ({@link authorization}).
 * Throws when none can be reached.
 */
export async function openSession(config: Config, options: SessionOptions): Promise<Session> {
  const name = options.name ?? config.seat;
  if (config.nats.servers.length > 0) {
    const nc = await connectTo(config.nats.servers, { name, ...credentialOptions(config.nats) });
    return { nc, url: config.nats.servers.join(","), close: () => nc.drain() };
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
    return { nc, url: running.url, close: () => nc.drain() };
  }
  const functions = options.functions ?? (await loadFunctions(config));
  const embedded = await startEmbedded({
    stateDir,
    users: authorization(config, functions, config.embedded),
    maxPayload: options.maxPayload,
  });
  try {
    const as: Credentials | undefined = user === config.seat ? embedded.seat : embedded.users[user];
    if (as === undefined) throw new Error(`the embedded server has no user ${user}`);
    const nc = await connectTo([embedded.url], { name, user: as.user, pass: as.password });
    return {
      nc,
      url: embedded.url,
      embedded,
      close: async () => {
        await nc.drain().catch(() => {});
        await embedded.stop();
      },
    };
  } catch (err) {
    await embedded.stop();
    throw err;
  }
}
