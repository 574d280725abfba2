/**
 * Asserting what the set stores on the bus: the config's buckets, the runtime's own and the
 * streams of event triggers, created when missing, never emptied nor changed (settings that
 * differ refuse start, saying each difference with the command that would mend it), and the
 * server-version warning for replicated buckets (docs/buckets.md §2.4).
 */
import { DiscardPolicy, nanos, RetentionPolicy, StorageType, type JetStreamManager, type KV, type NatsConnection } from "nats";
import type { Logger } from "pino";
import { CLAIM_DAYS, claimsBucket, recordsBucket, type BucketConfig, type Config } from "./config.ts";

/** The runtime's own buckets among the opened ones; no config name can be these. */
export const RECORDS = "<runtime>";
export const CLAIMS = "<claims>";

/** The settings of a bucket's or stream's stream that the config decides, as JetStream says them. */
interface StreamSettings {
  readonly num_replicas: number;
  readonly max_msgs_per_subject: number;
  readonly max_age: number;
  readonly max_bytes: number;
}

/** The config's words and the nats CLI's flag for each of {@link StreamSettings}. */
const SETTINGS: Record<keyof StreamSettings, { readonly said: string; readonly flag: (value: number) => string }> = {
  num_replicas: { said: "replicas", flag: (v) => `--replicas ${v}` },
  max_msgs_per_subject: { said: "history", flag: (v) => `--max-msgs-per-subject ${v}` },
  max_age: { said: "maxAgeSeconds", flag: (v) => `--max-age ${v === 0 ? "0" : `${v / 1e9}s`}` },
  max_bytes: { said: "maxBytes", flag: (v) => `--max-bytes ${v}` },
};

/**
 * What differs between a stream's settings and those wanted, said in the config's words with
 * the nats CLI command that would make them equal; `undefined` when nothing differs.
 */
export function settingsDiffer(stream: string, have: StreamSettings, want: StreamSettings): string | undefined {
  const keys = (Object.keys(SETTINGS) as (keyof StreamSettings)[]).filter((k) => have[k] !== want[k]);
  if (keys.length === 0) return undefined;
  const shown = (k: keyof StreamSettings, v: number) =>
    k === "max_age" ? (v === 0 ? "none" : `${v / 1e9}`) : k === "max_bytes" && v === -1 ? "none" : String(v);
  const said = keys.map((k) => `${SETTINGS[k].said} ${shown(k, have[k])} (the config says ${shown(k, want[k])})`);
  return `${said.join(", ")}; it is left as it is: edit it (nats stream edit ${stream} ${keys.map((k) => SETTINGS[k].flag(want[k])).join(" ")}) or make the config say what it has`;
}

/** Whether a server version (`2.9.10`) is older than `[major, minor, patch]`. */
function olderThan(version: string, than: readonly [number, number, number]): boolean {
  const parts = version.split(/[.-]/).slice(0, 3).map(Number);
  for (let i = 0; i < 3; i++) {
    const part = parts[i] ?? 0;
    if (part !== than[i]) return part < than[i]!;
  }
  return false;
}

/**
 * Asserts every bucket of `config.buckets`, and the runtime's own `<seat>_runtime` and
 * `<seat>_claims` (whose keys go after {@link CLAIM_DAYS} days), on the connection
 * (docs/buckets.md §2.4): a missing one is created as a JetStream key-value bucket with the
 * config's `history`, `replicas` (the bucket's, else the config's), `maxAgeSeconds` and
 * `maxBytes`, refusing rollup headers (so no writer can erase keys it was not granted); an
 * existing one is never emptied nor changed: when those settings differ, this throws saying each
 * difference of every bucket, having created none; a node-written one that still takes rollups
 * gets a warning. Returns the opened buckets by config name (reads go to the stream's leader when
 * it has replicas: a follower may lag); throws naming the bucket when the server refuses.
 */
export async function assertBuckets(nc: NatsConnection, config: Config, log: Logger): Promise<Map<string, KV>> {
  const jsm = await nc.jetstreamManager().catch((err: { code?: string; message: string }) => {
    // No responder to `$JS.API.INFO`: the server, or the seat's account, has no JetStream.
    if (err.code !== "503") throw err;
    throw new Error(
      `JetStream is off on ${nc.getServer()} for the seat's account: start nats-server with --jetstream, or put ` +
        "`jetstream { store_dir: … }` in its configuration (and `jetstream: enabled` in the seat's account when it has accounts)",
      { cause: err },
    );
  });
  const js = nc.jetstream();
  const all: [string, BucketConfig][] = [
    ...Object.entries(config.buckets),
    [RECORDS, { bucket: recordsBucket(config.seat), writtenBy: "seat", readBy: [], history: 1 }],
    [CLAIMS, { bucket: claimsBucket(config.seat), writtenBy: "seat", readBy: [], history: 1, maxAgeSeconds: CLAIM_DAYS * 86_400 }],
  ];
  const wanted = ({ history, replicas, maxAgeSeconds, maxBytes }: BucketConfig): StreamSettings => ({
    num_replicas: replicas ?? config.replicas,
    max_msgs_per_subject: history,
    max_age: maxAgeSeconds === undefined ? 0 : nanos(maxAgeSeconds * 1000),
    max_bytes: maxBytes ?? -1,
  });
  // First every bucket as it is: nothing is created while one of them differs from the config.
  const found = await Promise.all(
    all.map(async ([, { bucket }]) =>
      jsm.streams.info(`KV_${bucket}`).catch((err: Error) => {
        if (err.message === "stream not found") return undefined;
        throw new Error(`cannot assert bucket ${bucket}: ${err.message}`, { cause: err });
      }),
    ),
  );
  const differ = all.flatMap(([, settings], i) => {
    const info = found[i];
    const said = info && settingsDiffer(`KV_${settings.bucket}`, info.config, wanted(settings));
    return said ? [`bucket ${settings.bucket} exists with other settings than the config: ${said}`] : [];
  });
  if (differ.length > 0) throw new Error(differ.join("\n"));

  const replicated = all.some(([, settings], i) => (found[i]?.config.num_replicas ?? wanted(settings).num_replicas) > 1);
  if (replicated && olderThan(nc.info?.version ?? "0.0.0", [2, 9, 21])) {
    log.warn(
      { server: nc.info?.version },
      "nats-server before 2.9.21 does not check a replicated bucket's expected revision atomically (nats-server#4320): " +
        "compare-and-set writes of several replicas of the set may race; run 2.9.21 or later, or one replica of the set",
    );
  }
  const opened = new Map<string, KV>();
  await Promise.all(
    all.map(async ([name, settings], i) => {
      const { bucket, writtenBy } = settings;
      let info = found[i];
      try {
        info ??= await jsm.streams.add({
          name: `KV_${bucket}`,
          subjects: [`$KV.${bucket}.>`],
          retention: RetentionPolicy.Limits,
          storage: StorageType.File,
          discard: DiscardPolicy.New,
          allow_direct: true,
          deny_delete: true,
          allow_rollup_hdrs: false,
          ...wanted(settings),
        });
      } catch (err) {
        throw new Error(`cannot assert bucket ${bucket}: ${(err as Error).message}`, { cause: err });
      }
      if (writtenBy === "nodes" && info.config.allow_rollup_hdrs) {
        log.warn({ bucket }, "bucket takes rollup headers: a node could erase other nodes' keys");
      }
      const direct = info.config.allow_direct === true && info.config.num_replicas === 1;
      opened.set(name, await js.views.kv(bucket, { bindOnly: true, allow_direct: direct }));
    }),
  );
  return opened;
}

/**
 * Asserts the streams event triggers name (`subjects`: stream config name → the subjects it
 * must capture): a missing one is created limits-based (file storage, `maxAgeSeconds`,
 * `maxBytes`, the oldest dropped first, `replicas` copies: the stream's, else the config's); an
 * existing one is given the subjects it lacks, never emptied nor given other limits. Throws
 * naming the stream when the server refuses (e.g. subjects another stream already captures), or
 * saying each difference when the existing one has other replicas or limits.
 */
export async function assertStreams(
  jsm: JetStreamManager,
  config: Config,
  subjectsByStream: ReadonlyMap<string, readonly string[]>,
  log: Logger,
): Promise<void> {
  for (const [name, subjects] of subjectsByStream) {
    const { stream, maxAgeSeconds, maxBytes, replicas = config.replicas } = config.streams[name]!;
    const wanted = { num_replicas: replicas, max_age: nanos(maxAgeSeconds * 1000), max_bytes: maxBytes };
    try {
      const info = await jsm.streams.info(stream).catch((err: Error) => {
        if (err.message !== "stream not found") throw err;
        log.info({ stream, subjects }, "creating stream");
        return jsm.streams.add({
          name: stream,
          subjects: [...subjects],
          retention: RetentionPolicy.Limits,
          storage: StorageType.File,
          discard: DiscardPolicy.Old,
          // Publish ids are remembered 2 minutes, never longer than a message is kept.
          duplicate_window: nanos(Math.min(120, maxAgeSeconds) * 1000),
          ...wanted,
        });
      });
      // Other limits could drop events not handled yet: said, never applied.
      const differs = settingsDiffer(stream, info.config, { ...wanted, max_msgs_per_subject: info.config.max_msgs_per_subject });
      if (differs !== undefined) throw new Error(`it exists with other settings than the config: ${differs}`);
      const missing = subjects.filter((s) => !info.config.subjects.includes(s));
      if (missing.length > 0) {
        log.info({ stream, missing }, "adding subjects to the stream");
        await jsm.streams.update(stream, { ...info.config, subjects: [...info.config.subjects, ...missing] });
      }
    } catch (err) {
      const message = (err as Error).message;
      // The server cannot reserve the stream's bytes: say which setting asks for them.
      const reserve = /insufficient|resources/i.test(message)
        ? ` (the config's streams.${name}.maxBytes asks the server to reserve ${maxBytes} bytes: lower it, or give JetStream more storage)`
        : "";
      throw new Error(`cannot assert stream ${stream} (for ${subjects.join(", ")}): ${message}${reserve}`, { cause: err });
    }
  }
}
