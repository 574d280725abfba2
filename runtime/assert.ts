/**
 * Asserting what the set stores on the bus: the config's buckets, the runtime's own and the
 * streams of event triggers, created when missing, never emptied nor changed (settings that
 * differ refuse start, saying each difference with the command that would mend it), and the
 * server-version warning for replicated buckets (docs/buckets.md §2.4).
 */
import {
  DiscardPolicy,
  ErrorCode,
  nanos,
  RetentionPolicy,
  StorageType,
  type JetStreamManager,
  type KV,
  type NatsConnection,
  type StreamConfig,
  type StreamInfo,
} from "nats";
import type { Logger } from "pino";
import {
  ASSERT_RETRY_MS,
  errCode,
  NOT_ENABLED,
  NOT_ENABLED_FOR_ACCOUNT,
  reasonOf,
  retryElecting,
  STREAM_NAME_IN_USE,
  STREAM_NOT_FOUND,
} from "./jetstream.ts";
import { CLAIM_DAYS, claimsBucket, recordsBucket, type BucketConfig, type Config } from "./config.ts";
import { subjectCovers, uncovered } from "./subjects.ts";

/** The runtime's own buckets among the opened ones; no config name can be these. */
export const RECORDS = "<runtime>";
export const CLAIMS = "<claims>";

/** A stream's info answered while its group has no leader (by a member, from what it holds). */
class Leaderless extends Error {
  override readonly name = "Leaderless";
}

/**
 * The info of stream `name`, asked again until the deadline ({@link retryElecting}). `undefined`
 * when the server says it is not there, unless `exists` (it was just made, or found): then that
 * is asked again too, as is an info without a leader, so what it returns comes from the stream's
 * leader.
 */
function streamInfo(jsm: JetStreamManager, name: string, log: Logger, deadline: number, exists: true): Promise<StreamInfo>;
function streamInfo(jsm: JetStreamManager, name: string, log: Logger, deadline: number): Promise<StreamInfo | undefined>;
function streamInfo(jsm: JetStreamManager, name: string, log: Logger, deadline: number, exists = false): Promise<StreamInfo | undefined> {
  const attempt = async () => {
    const info = await jsm.streams.info(name);
    if (exists && leaderless(info)) throw new Leaderless(`stream ${name} has no leader`);
    return info;
  };
  const alsoWhile = (err: unknown) => exists && (err instanceof Leaderless || errCode(err) === STREAM_NOT_FOUND);
  return retryElecting(attempt, { log, about: { stream: name }, deadline, alsoWhile }).catch((err: unknown) => {
    if (!exists && errCode(err) === STREAM_NOT_FOUND) return undefined;
    throw err;
  });
}

/** Whether a stream's info says its group has no leader now (a standalone server is its streams' leader). */
const leaderless = (info: StreamInfo): boolean => info.cluster !== undefined && !info.cluster.leader;

/**
 * Makes the stream `config` says, and returns its info from its leader. One made meanwhile by
 * another replica or the controller is returned as it is (the server answers with its info when
 * the config is the same; `stream name already in use` when it is another: then read). Asked
 * again until `deadline` ({@link retryElecting}).
 */
async function addStream(
  jsm: JetStreamManager,
  config: Partial<StreamConfig> & { name: string },
  log: Logger,
  deadline: number,
): Promise<StreamInfo> {
  const made = await retryElecting(() => jsm.streams.add(config), { log, about: { stream: config.name }, deadline }).catch(
    (err: unknown) => {
      if (errCode(err) === STREAM_NAME_IN_USE) return undefined;
      throw err;
    },
  );
  return made === undefined || leaderless(made) ? streamInfo(jsm, config.name, log, deadline, true) : made;
}

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
 * `<seat>_claims` (whose keys go after {@link CLAIM_DAYS} days), or of those the buckets named in
 * `only` (by their bucket names: those found deleted behind the set), telling `created` of each
 * one it makes, on the connection
 * (docs/buckets.md §2.4): a missing one is created as a JetStream key-value bucket with the
 * config's `history`, `replicas` (the bucket's, else the config's), `maxAgeSeconds` and
 * `maxBytes`, refusing rollup headers (so no writer can erase keys it was not granted); an
 * existing one is never emptied nor changed: when those settings differ, this throws saying each
 * difference of every bucket, having created none; a node-written one that still takes rollups
 * gets a warning. Safe while other replicas of the set assert the same on a cluster still
 * electing its leaders: requests are asked again as {@link retryElecting} says, and a bucket
 * made meanwhile is compared as one found. Returns the opened buckets by config name (reads go
 * to the stream's leader when it has replicas: a follower may lag); throws naming the bucket,
 * with the server's last reason, when the server refuses or does not answer for
 * {@link ASSERT_RETRY_MS}, and saying so when the server or the seat's account has no JetStream.
 */
export async function assertBuckets(
  nc: NatsConnection,
  config: Config,
  log: Logger,
  { only, created }: { only?: readonly string[]; created?: (bucket: string) => void } = {},
): Promise<Map<string, KV>> {
  const server = nc.getServer();
  // One deadline for every request: the whole assertion gives up after ASSERT_RETRY_MS.
  const deadline = Date.now() + ASSERT_RETRY_MS;
  const jsm = await nc.jetstreamManager({ checkAPI: false });
  const account = await retryElecting(
    () =>
      jsm.getAccountInfo().catch((err: { code?: string }) => {
        // No responder to `$JS.API.INFO`, or the server saying JetStream is not enabled: off. Not
        // "temporarily unavailable", as a cluster with no meta leader yet says.
        const code = errCode(err);
        const off = code === undefined ? err.code === ErrorCode.NoResponders : code === NOT_ENABLED_FOR_ACCOUNT || code === NOT_ENABLED;
        if (off) return undefined;
        throw err;
      }),
    { log, about: { server }, deadline },
  ).catch((err: Error) => {
    throw new Error(`cannot reach JetStream on ${server}: ${reasonOf(err)}`, { cause: err });
  });
  if (account === undefined) {
    throw new Error(
      `JetStream is off on ${server} for the seat's account: start nats-server with --jetstream, or put ` +
        "`jetstream { store_dir: … }` in its configuration (and `jetstream: enabled` in the seat's account when it has accounts)",
    );
  }
  // Opening a bucket asks nothing of the server: whether JetStream is on was just asked.
  const js = nc.jetstream({ checkAPI: false });
  const all: [string, BucketConfig][] = (
    [
      ...Object.entries(config.buckets),
      [RECORDS, { bucket: recordsBucket(config.seat), writtenBy: "seat", readBy: [], history: 1 }],
      [CLAIMS, { bucket: claimsBucket(config.seat), writtenBy: "seat", readBy: [], history: 1, maxAgeSeconds: CLAIM_DAYS * 86_400 }],
    ] satisfies [string, BucketConfig][]
  ).filter(([, { bucket }]) => only === undefined || only.includes(bucket));
  const wanted = ({ history, replicas, maxAgeSeconds, maxBytes }: BucketConfig): StreamSettings => ({
    num_replicas: replicas ?? config.replicas,
    max_msgs_per_subject: history,
    max_age: maxAgeSeconds === undefined ? 0 : nanos(maxAgeSeconds * 1000),
    max_bytes: maxBytes ?? -1,
  });
  const differs = (bucket: string, info: StreamInfo, settings: BucketConfig) => {
    const said = settingsDiffer(`KV_${bucket}`, info.config, wanted(settings));
    return said && `bucket ${bucket} exists with other settings than the config: ${said}`;
  };
  // First every bucket as it is: nothing is created while one of them differs from the config.
  const found = await Promise.all(
    all.map(async ([, { bucket }]) =>
      streamInfo(jsm, `KV_${bucket}`, log, deadline).catch((err: Error) => {
        throw new Error(`cannot assert bucket ${bucket}: ${reasonOf(err)}`, { cause: err });
      }),
    ),
  );
  const differ = all.flatMap(([, settings], i) => {
    const info = found[i];
    const said = info && differs(settings.bucket, info, settings);
    return said ? [said] : [];
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
      if (info === undefined) {
        info = await addStream(
          jsm,
          {
            name: `KV_${bucket}`,
            subjects: [`$KV.${bucket}.>`],
            retention: RetentionPolicy.Limits,
            storage: StorageType.File,
            discard: DiscardPolicy.New,
            allow_direct: true,
            deny_delete: true,
            allow_rollup_hdrs: false,
            ...wanted(settings),
          },
          log,
          deadline,
        ).catch((err: Error) => {
          throw new Error(`cannot assert bucket ${bucket}: ${reasonOf(err)}`, { cause: err });
        });
        // Made meanwhile by another replica or the controller, with other settings.
        const said = differs(bucket, info, settings);
        if (said) throw new Error(said);
        created?.(bucket);
      } else if (leaderless(info)) {
        // Found as a member holds it: used once its leader answers.
        info = await streamInfo(jsm, `KV_${bucket}`, log, deadline, true).catch((err: Error) => {
          throw new Error(`cannot assert bucket ${bucket}: ${reasonOf(err)}`, { cause: err });
        });
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
 * existing one is given the subjects it lacks, never emptied nor given other limits. Safe while
 * other replicas assert the same, as {@link assertBuckets}. Returns each stream's info as it
 * stands, by config name. Throws naming the stream when the server refuses (e.g. subjects
 * another stream already captures) or does not answer for {@link ASSERT_RETRY_MS}, or saying
 * each difference when the existing one has other replicas or limits.
 */
export async function assertStreams(
  jsm: JetStreamManager,
  config: Config,
  subjectsByStream: ReadonlyMap<string, readonly string[]>,
  log: Logger,
): Promise<Map<string, StreamInfo>> {
  const asserted = new Map<string, StreamInfo>();
  const deadline = Date.now() + ASSERT_RETRY_MS;
  for (const [name, subjects] of subjectsByStream) {
    const { stream, maxAgeSeconds, maxBytes, replicas = config.replicas } = config.streams[name]!;
    const wanted = { num_replicas: replicas, max_age: nanos(maxAgeSeconds * 1000), max_bytes: maxBytes };
    try {
      let info = await streamInfo(jsm, stream, log, deadline);
      if (info === undefined) {
        log.info({ stream, subjects }, "creating stream");
        info = await addStream(
          jsm,
          {
            name: stream,
            subjects: [...subjects],
            retention: RetentionPolicy.Limits,
            storage: StorageType.File,
            discard: DiscardPolicy.Old,
            // Publish ids are remembered 2 minutes, never longer than a message is kept.
            duplicate_window: nanos(Math.min(120, maxAgeSeconds) * 1000),
            ...wanted,
          },
          log,
          deadline,
        );
      } else if (leaderless(info)) {
        info = await streamInfo(jsm, stream, log, deadline, true);
      }
      // Other limits could drop events not handled yet: said, never applied.
      const differs = settingsDiffer(stream, info.config, { ...wanted, max_msgs_per_subject: info.config.max_msgs_per_subject });
      if (differs !== undefined) throw new Error(`it exists with other settings than the config: ${differs}`);
      const missing = subjects.filter((s) => !info!.config.subjects.some((kept) => subjectCovers(kept, s)));
      if (missing.length > 0) {
        log.info({ stream, missing }, "adding subjects to the stream");
        // A subject added that covers some the stream has takes their place: it captures all they did.
        const update = { ...info.config, subjects: uncovered([...info.config.subjects, ...missing]) };
        info = await retryElecting(() => jsm.streams.update(stream, update), { log, about: { stream }, deadline });
      }
      asserted.set(name, info);
    } catch (err) {
      const message = reasonOf(err);
      // The server cannot reserve the stream's bytes: say which setting asks for them.
      const reserve = /insufficient|resources/i.test(message)
        ? ` (the config's streams.${name}.maxBytes asks the server to reserve ${maxBytes} bytes: lower it, or give JetStream more storage)`
        : "";
      throw new Error(`cannot assert stream ${stream} (for ${subjects.join(", ")}): ${message}${reserve}`, { cause: err });
    }
  }
  return asserted;
}
