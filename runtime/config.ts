/**
 * The deployment's config: `wrangler-free.config.ts` validated with its schema, the environment
 * applied over it (`NATS_URL`, credentials, `HTTP_HOST`, `HTTP_PORT`, `HTTP_TOKEN`, `NATS_REPLICAS`…), and
 * folders resolved against the file's own. A contract (docs/runtime.md §6.6).
 */
import { existsSync } from "node:fs";
import { dirname, relative, resolve } from "node:path";
import { z } from "zod";
import { formatIssues, thrownText } from "./errors.ts";
import { importModule } from "./modules.ts";

/** The name of the config file the CLI looks for in the working folder. */
export const CONFIG_FILE = "wrangler-free.config.ts";

const name = z.string().regex(/^[A-Za-z0-9_-]+$/, "must be letters, digits, - or _");
const nodeName = z.string().regex(/^[A-Za-z0-9_/=-]+$/, "must be one token (A-Z a-z 0-9 - _ / =)");

/** Copies of a bucket or stream: 1 on one server, 3 (or 5) on a cluster, so that losing one server loses nothing. */
const replicas = z.union([z.literal(1), z.literal(3), z.literal(5)], "must be 1, 3 or 5");

const bucketSchema = z.strictObject({
  /** The JetStream key-value bucket's name. */
  bucket: name,
  /** Who writes it: the seat itself, each node its own keys, or the controller all of it (docs/buckets.md §2). */
  writtenBy: z.enum(["seat", "nodes", "controller"]),
  /** Of a bucket nodes write, each node's keys: those under `<node>.` (`under`, when absent), or its one key `<node>` (`own`). */
  nodeKeys: z.enum(["under", "own"]).optional(),
  /** Who else reads all of it: nodes (e.g. the registry), providers (e.g. the needs). */
  readBy: z.array(z.enum(["nodes", "providers"])).default([]),
  /** Values kept per key. */
  history: z.number().int().min(1).max(64).default(1),
  /** Copies of the bucket on a cluster's servers (1, 3 or 5); the config's `replicas` when absent. */
  replicas: replicas.optional(),
  /** How long a value is kept, in seconds; for ever when absent. */
  maxAgeSeconds: z.number().int().min(1).optional(),
  /** The most bytes the bucket holds; a write beyond is refused. No limit when absent. */
  maxBytes: z.number().int().min(1024).optional(),
});

const DAY = 24 * 60 * 60;

/** The HTTP bearer token: an RFC 6750 token (what `Authorization: Bearer` may carry), long enough not to be guessed. */
const httpToken = z
  .string()
  .min(16, "must be at least 16 characters (e.g. `openssl rand -hex 32`)")
  .regex(/^[A-Za-z0-9._~+/-]+=*$/, "must be letters, digits and . _ ~ + / - (then = only), as a bearer token is");

/** A subject without wildcards, `{<who>}` allowed in its tokens for the user's name. */
const subjectOf = (who: string) => z.string().regex(/^[A-Za-z0-9_/={}-]+(\.[A-Za-z0-9_/={}-]+)*$/, `must be a subject, \`${who}\` allowed`);

const streamSchema = z.strictObject({
  /** The JetStream stream's name. */
  stream: name,
  /** How long a message is kept, in seconds (a limits-based stream: older ones are dropped). */
  maxAgeSeconds: z
    .number()
    .int()
    .min(1)
    .default(7 * DAY),
  /** The most bytes the stream keeps; the oldest messages go first. */
  maxBytes: z
    .number()
    .int()
    .min(1024)
    .default(1024 ** 3),
  /**
   * Seconds an event handed to a replica of the set may go unacknowledged before the server
   * hands it to another: how long the events a crashed replica held wait.
   */
  ackWaitSeconds: z.number().int().min(1).max(3600).default(30),
  /** Copies of the stream on a cluster's servers; the config's `replicas` when absent. */
  replicas: replicas.optional(),
});

/**
 * The runtime's part of `wrangler-free.config.ts`. Top-level fields beyond these belong to the
 * functions: each is checked against the `config` schema of the functions that read it.
 */
export const configSchema = z.looseObject({
  /** The seat the function set holds: its service name and queue group. */
  seat: name,
  /** Folder of function files, relative to the config file. */
  functions: z.string().min(1).default("functions"),
  /** Folder of local state (the embedded server's store and credentials), git-ignored. */
  state: z.string().min(1).default(".state"),
  nats: z
    .strictObject({
      /** Server URLs; none means: start the embedded nats-server. */
      servers: z.array(z.string().min(1)).default([]),
      creds: z.string().min(1).optional(),
      nkey: z.string().min(1).optional(),
      user: z.string().min(1).optional(),
      password: z.string().optional(),
      token: z.string().min(1).optional(),
      /** TLS files: `ca` to trust the server, `cert` and `key` when it asks for a client certificate. */
      tls: z
        .strictObject({ ca: z.string().min(1).optional(), cert: z.string().min(1).optional(), key: z.string().min(1).optional() })
        .optional(),
    })
    .default({ servers: [] }),
  /**
   * Copies of every bucket and stream (the runtime's own included) unless one says otherwise:
   * 1 on one server (the embedded default), 3 on a cluster.
   */
  replicas: replicas.default(1),
  /** Where HTTP listens, and who may ask it (docs/runtime.md §6.3.4). */
  http: z
    .strictObject({
      host: z.string().min(1).default("127.0.0.1"),
      port: z.number().int().min(0).max(65535).default(8787),
      /** The bearer token every route but `/healthz` and `/readyz` asks for; none asked when absent. */
      token: httpToken.optional(),
      /** True: a host that is not a loopback address may go without a token (the network is trusted). */
      trustedNetwork: z.boolean().optional(),
    })
    .default({ host: "127.0.0.1", port: 8787 }),
  /** Buckets by the name functions use in `access`; all are asserted at start. */
  buckets: z.record(name, bucketSchema),
  /**
   * Streams by the name `{ event, stream }` triggers use; each captures the event subjects of
   * its triggers and is asserted at start.
   */
  streams: z.record(name, streamSchema).default({}),
  /**
   * What every provider may publish and what the seat publishes to it: subjects, `{provider}`
   * standing for its name.
   */
  providers: z
    .strictObject({
      publish: z.array(subjectOf("{provider}")).default([]),
      receive: z.array(subjectOf("{provider}")).default([]),
    })
    .default({ publish: [], receive: [] }),
  /** What every node may publish and what the seat publishes to it: subjects, `{node}` standing for its name. */
  nodes: z
    .strictObject({ publish: z.array(subjectOf("{node}")).default([]), receive: z.array(subjectOf("{node}")).default([]) })
    .default({ publish: [], receive: [] }),
  /** The embedded nats-server's users besides the seat. */
  embedded: z
    .strictObject({
      /** One user per node: writes its own keys of node-written buckets. */
      nodes: z.array(nodeName).default([]),
      /** One user per provider. */
      providers: z.array(nodeName).default([]),
      /** The controller's user: writes the controller-written buckets (its assignments mirror). */
      controllers: z.array(nodeName).default([]),
    })
    .default({ nodes: [], providers: [], controllers: [] }),
});

/** The runtime's own bucket of a seat: its records, shared by every replica of the set (docs/buckets.md §2.5). */
export const recordsBucket = (seat: string): string => `${seat}_runtime`;
/** The runtime's bucket of claimed scheduled runs (`<function>.<scheduled time, ms>`), kept {@link CLAIM_DAYS} days. */
export const claimsBucket = (seat: string): string => `${seat}_claims`;
export const CLAIM_DAYS = 1;

/** What `wrangler-free.config.ts` may hold (fields with defaults may be left out). */
export type ConfigInput = z.input<typeof configSchema>;
/** A validated config, with env overrides applied and `root` the config file's folder. */
export type Config = z.output<typeof configSchema> & {
  readonly root: string;
  readonly file: string;
  /** Where each file of `nats` was named, as errors say it: its variable (`NATS_CREDS`), or `nats.creds in <config file>`. */
  readonly namedBy?: NatsFileNames;
};

/** The fields a resolved config has that no config file writes. */
export const RESOLVED_FIELDS: readonly string[] = ["root", "file", "namedBy"] satisfies (keyof Config)[];

/** The files `nats` may name (a creds file, an nkey seed, TLS files), each with where it was named. */
export type NatsFileNames = Readonly<Record<"creds" | "nkey" | "ca" | "cert" | "key", string>>;
/** The variable of each file of `nats`: what an error names when it was not the config file. */
export const NATS_FILE_VARIABLES = {
  creds: "NATS_CREDS",
  nkey: "NATS_NKEY",
  ca: "NATS_CA",
  cert: "NATS_CERT",
  key: "NATS_KEY",
} as const satisfies NatsFileNames;
export type BucketConfig = z.output<typeof bucketSchema>;
export type StreamConfig = z.output<typeof streamSchema>;

/** Types a config file's default export. Returns `config` unchanged; checks happen at load. */
export function defineConfig<const C extends ConfigInput>(config: C): C {
  return config;
}

/** A config that cannot be used; the message names the file and the field. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

const PORT = "must be a port number, 0 to 65535 (0 picks a free one)";
const envSchema = z.object({
  NATS_URL: z.string().optional(),
  NATS_CREDS: z.string().min(1).optional(),
  NATS_NKEY: z.string().min(1).optional(),
  NATS_USER: z.string().min(1).optional(),
  NATS_PASSWORD: z.string().optional(),
  NATS_TOKEN: z.string().min(1).optional(),
  NATS_CA: z.string().min(1).optional(),
  NATS_CERT: z.string().min(1).optional(),
  NATS_KEY: z.string().min(1).optional(),
  HTTP_HOST: z.string().min(1).optional(),
  // Digits only: an empty or blank value is refused, not read as 0 (a free port).
  HTTP_PORT: z.string().regex(/^\d+$/, PORT).transform(Number).pipe(z.number().max(65535, PORT)).optional(),
  HTTP_TOKEN: httpToken.optional(),
  HTTP_TRUSTED_NETWORK: z
    .enum(["1", "true", "0", "false"], "must be 1 or true (the network is trusted), 0 or false")
    .transform((v) => v === "1" || v === "true")
    .optional(),
  NATS_REPLICAS: z.string().regex(/^\d+$/, "must be 1, 3 or 5").transform(Number).pipe(replicas).optional(),
});

/**
 * Validates a raw config and applies the environment of docs/runtime.md §6 over it: `NATS_URL`
 * (comma-separated servers), `NATS_CREDS`, `NATS_NKEY`, `NATS_USER`, `NATS_PASSWORD`,
 * `NATS_TOKEN`, `NATS_CA`, `NATS_CERT`, `NATS_KEY`, `NATS_REPLICAS` (the config's `replicas`),
 * `HTTP_HOST`, `HTTP_PORT`, `HTTP_TOKEN`, `HTTP_TRUSTED_NETWORK`. Throws {@link ConfigError}
 * naming `file` and the field.
 */
export function resolveConfig(raw: unknown, file: string, env: NodeJS.ProcessEnv = process.env): Config {
  const shown = relative(process.cwd(), file) || file;
  const parsed = configSchema.safeParse(raw);
  if (!parsed.success) throw new ConfigError(`${shown}: ${formatIssues(parsed.error.issues)}`);
  const vars = envSchema.safeParse(env);
  if (!vars.success) throw new ConfigError(`environment: ${formatIssues(vars.error.issues)}`);
  const e = vars.data;
  const config = parsed.data;
  // One bucket under two names would mix what each name's functions read and write.
  const named = [
    ...Object.entries(config.buckets).map(([key, b]) => [`buckets.${key}`, b.bucket] as const),
    ["the runtime's records", recordsBucket(config.seat)] as const,
    ["the runtime's claims", claimsBucket(config.seat)] as const,
  ];
  const shared = named.filter(([, bucket], i) => named.findIndex(([, other]) => other === bucket) !== i);
  if (shared.length > 0) {
    const said = [...new Set(shared.map(([, bucket]) => bucket))].map(
      (bucket) =>
        `bucket ${bucket} is named by ${named
          .filter(([, b]) => b === bucket)
          .map(([name]) => name)
          .join(" and ")}`,
    );
    throw new ConfigError(`${shown}: ${said.join("; ")}: each bucket has one name`);
  }
  const servers = e.NATS_URL?.split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
  if (e.NATS_URL !== undefined && e.NATS_URL.trim() !== "" && servers!.length === 0) {
    throw new ConfigError(`environment: NATS_URL: holds no server URL (${JSON.stringify(e.NATS_URL)})`);
  }
  // Each file of `nats`: the variable's (from the working folder), else the config file's (from
  // its folder, as its folders are), and where it was named, for the errors about it.
  const tls = config.nats.tls;
  const written: Record<keyof NatsFileNames, string | undefined> = {
    creds: config.nats.creds,
    nkey: config.nats.nkey,
    ca: tls?.ca,
    cert: tls?.cert,
    key: tls?.key,
  };
  const chosen = (field: keyof NatsFileNames) => {
    const variable = e[NATS_FILE_VARIABLES[field]];
    if (variable !== undefined || written[field] === undefined) return { path: variable, by: NATS_FILE_VARIABLES[field] };
    const said = field === "creds" || field === "nkey" ? field : `tls.${field}`;
    return { path: resolve(dirname(file), written[field]), by: `nats.${said} in ${shown}` };
  };
  const files = { creds: chosen("creds"), nkey: chosen("nkey"), ca: chosen("ca"), cert: chosen("cert"), key: chosen("key") };
  const { ca, cert, key } = files;
  return {
    ...config,
    root: dirname(file),
    file,
    namedBy: { creds: files.creds.by, nkey: files.nkey.by, ca: ca.by, cert: cert.by, key: key.by },
    nats: {
      ...config.nats,
      servers: servers && servers.length > 0 ? servers : config.nats.servers,
      creds: files.creds.path,
      nkey: files.nkey.path,
      user: e.NATS_USER ?? config.nats.user,
      password: e.NATS_PASSWORD ?? config.nats.password,
      token: e.NATS_TOKEN ?? config.nats.token,
      ...(tls !== undefined || ca.path || cert.path || key.path
        ? {
            tls: {
              ...(ca.path ? { ca: ca.path } : {}),
              ...(cert.path ? { cert: cert.path } : {}),
              ...(key.path ? { key: key.path } : {}),
            },
          }
        : {}),
    },
    replicas: e.NATS_REPLICAS ?? config.replicas,
    http: {
      host: e.HTTP_HOST ?? config.http.host,
      port: e.HTTP_PORT ?? config.http.port,
      token: e.HTTP_TOKEN ?? config.http.token,
      trustedNetwork: e.HTTP_TRUSTED_NETWORK ?? config.http.trustedNetwork,
    },
  };
}

/**
 * Imports the config file (default `./wrangler-free.config.ts`; built or through tsx, runtime/modules.ts) and resolves it with
 * {@link resolveConfig}. Throws {@link ConfigError} when the file is missing or invalid.
 */
export async function loadConfig(file: string = resolve(CONFIG_FILE), env: NodeJS.ProcessEnv = process.env): Promise<Config> {
  const path = resolve(file);
  if (!existsSync(path)) throw new ConfigError(`${file}: no such config file`);
  let module: { default?: unknown };
  try {
    module = (await importModule(path)) as { default?: unknown };
  } catch (err) {
    throw new ConfigError(`${file}: cannot be loaded: ${thrownText(err)}`, { cause: err });
  }
  if (module.default === undefined) throw new ConfigError(`${file}: has no default export; export default defineConfig({...})`);
  return resolveConfig(module.default, path, env);
}

/** Resolves a folder named in the config (functions, state) against the config's folder. */
export function configPath(config: Config, folder: string): string {
  return resolve(config.root, folder);
}
