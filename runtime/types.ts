/**
 * The contract types a function and the runtime share: the bucket handles a function reads and
 * writes through, what triggered a run, the metric handles, `ctx`, the runtime's records, and how
 * a run ends. Types only: no file of the runtime implements anything here, and every file may
 * import it (docs/runtime.md §6.4).
 */
import type { Logger } from "pino";

/** One live key of a bucket: its value as stored, its revision (stream sequence) and write time. */
export interface Entry {
  readonly key: string;
  readonly value: Uint8Array;
  readonly revision: number;
  /** When the server stored the write, to the millisecond. */
  readonly created: Date;
  /** The same, in nanoseconds since the epoch (to about a microsecond): writes of one millisecond told apart. */
  readonly createdNanos: number;
}

/**
 * The last record of a key: a live value, or a delete marker (`deleted`), whose value is what
 * the delete left in it ({@link WriteBucket.delete} with `value`), empty otherwise.
 */
export interface KeyRecord extends Entry {
  readonly deleted: boolean;
}

/** Which part of a listing to return: the keys after `after` (in key order), at most `limit` of them. */
export interface ListOptions {
  readonly after?: string;
  readonly limit?: number;
}

/** A bucket a function declared under `access.reads`: it can be read, never written. */
export interface ReadBucket {
  /** The JetStream key-value bucket behind the handle. */
  readonly bucket: string;
  /** The live value of `key`, or `null` when the key is missing or deleted. */
  get(key: string): Promise<Entry | null>;
  /**
   * Every live key matching any of `filters` (NATS subject wildcards `*` and `>`), in key order,
   * narrowed by `options`. The read reflects every write acknowledged before it.
   */
  list(filters: string | readonly string[], options?: ListOptions): Promise<Entry[]>;
  /** The last record of `key`, a delete marker included; `null` when the key was never written. */
  last(key: string): Promise<KeyRecord | null>;
  /** Like {@link list}, with the delete markers of deleted keys too. */
  records(filters: string | readonly string[], options?: ListOptions): Promise<KeyRecord[]>;
}

/** A bucket a function declared under `access.writes`. Writes return the new revision. */
export interface WriteBucket extends ReadBucket {
  /** Writes `key` only if it has no live value. Throws `RevisionConflict` otherwise. */
  create(key: string, value: Uint8Array | string): Promise<number>;
  /**
   * Writes `key` only if its last record (a delete marker included) is still at `revision`;
   * 0 means the key was never written. Throws `RevisionConflict`.
   */
  update(key: string, value: Uint8Array | string, revision: number): Promise<number>;
  /** Writes `key` unconditionally. */
  put(key: string, value: Uint8Array | string): Promise<number>;
  /**
   * Deletes `key`. With `revision`, only if that is still its last record's revision (0: the
   * key was never written), else throws `RevisionConflict`. With `value`, the delete
   * marker keeps it, for {@link ReadBucket.last} and {@link ReadBucket.records} to read back;
   * readers of live keys see the key gone either way.
   */
  delete(key: string, options?: { revision?: number; value?: Uint8Array | string }): Promise<number>;
}

/**
 * A bucket read through a live view: the reads of a {@link ReadBucket}, answered from memory once
 * the view holds every write acknowledged before the read. A key read again, unchanged, is the
 * same object: treat what reads return as read-only.
 */
export interface ViewBucket extends ReadBucket {
  /**
   * The same reads answered from what the view holds now, without first asking the server
   * whether it holds everything: the latest writes may be missing. For compare-and-set writers,
   * whose write based on a stale revision fails and can be decided again.
   */
  readonly local: ReadBucket;
  /**
   * When the view was last confirmed to hold every write acknowledged before (a read that asked
   * the server found it current); `null` before any. A handle that reads the server each time
   * says now.
   */
  confirmedAt(): Date | null;
  /**
   * Once the view holds every write acknowledged before the call (one check, as a read makes):
   * reads answered from what it holds then, and its stamp. When the view cannot tell, reads
   * from the server and a stamp never given before. Throws as a read does.
   */
  snapshot(): Promise<Snapshot>;
  /** What the view holds now, without asking the server (as `local`), and its stamp. */
  localSnapshot(): Snapshot;
}

/**
 * Reads of one state of a view, and a stamp of that state: two snapshots with the same stamp
 * hold the same keys and values, so what is derived from one holds for the other.
 */
export interface Snapshot {
  readonly stamp: string;
  readonly reads: ReadBucket;
  /**
   * The keys written, deleted or purged after the state an earlier `stamp` of the same view
   * named, each once, in no set order (some written since this snapshot may be among them);
   * `undefined` when that cannot be told: a stamp of another view or load, a server read, or
   * more changes ago than the view keeps (docs/runtime.md §6.12).
   */
  changedSince(stamp: string): readonly string[] | undefined;
}

/** The clock a function reads time from; tests may hand in their own. */
export interface Clock {
  now(): Date;
}

/** Label values of one sample, by label name; only the labels the metric declared. */
export type Labels = Readonly<Record<string, string | number>>;

/** A counter a function declared: it only goes up. */
export interface CounterMetric {
  /** Adds `value` (default 1, never negative) to the sample of `labels`. */
  inc(value?: number, labels?: Labels): void;
}

/** A gauge a function declared: a value that goes up and down. */
export interface GaugeMetric {
  set(value: number, labels?: Labels): void;
  inc(value?: number, labels?: Labels): void;
  dec(value?: number, labels?: Labels): void;
}

/**
 * A metric a function declares, served on `GET /metrics` beside the runtime's: a Prometheus
 * name (`[a-zA-Z_:][a-zA-Z0-9_:]*`, once in the whole set), its help text and label names. A
 * gauge's `collect` is called at every scrape (trigger `scrape`, same `ctx` as the handler) and
 * the gauge is then its answer (one value, or samples by labels); a throw keeps the previous
 * value and logs a warning.
 */
export type MetricDeclaration<Ctx = never> =
  | { readonly type: "counter"; readonly help: string; readonly labels?: readonly string[] }
  | {
      readonly type: "gauge";
      readonly help: string;
      readonly labels?: readonly string[];
      readonly collect?: (ctx: Ctx) => GaugeValue | Promise<GaugeValue>;
    };

/** What a gauge's `collect` answers: its one value, or its samples by labels (the gauge is then exactly those). */
export type GaugeValue = number | readonly { readonly labels: Labels; readonly value: number }[];

/** The handle `ctx.metrics` holds for each declared metric, by the metric's type. */
export type MetricHandles<Declared> = {
  readonly [M in keyof Declared]: Declared[M] extends "counter" ? CounterMetric : GaugeMetric;
};

/** A function's last successful scheduled run (cron or start). */
export interface Run {
  readonly at: Date;
  readonly trigger: "cron" | "start";
}

/** Events refused by one function: how many, and the last one. */
export interface RefusedEvents {
  readonly count: number;
  readonly last?: { readonly subject: string; readonly reason: string; readonly at: string };
}

/** One stream the set's triggers use, as the server last said (docs/runtime.md §6.11). */
export interface StreamUse {
  /** The stream's name on the server. */
  readonly stream: string;
  readonly bytes: number;
  /** Its limit in bytes (the oldest messages go beyond it); `null` when it has none. */
  readonly maxBytes: number | null;
  readonly messages: number;
  /** How long a delivered message may go unacknowledged before another replica gets it, in seconds. */
  readonly ackWaitSeconds: number;
  /** Its durable consumers: messages not delivered yet, and delivered but not acknowledged yet. */
  readonly consumers: readonly { readonly durable: string; readonly pending: number; readonly unacknowledged: number }[];
  /** That the server has no such stream, as last asked (nothing is recorded in it meanwhile; the other figures are its last); `null` while it has. */
  readonly missing: string | null;
}

/**
 * What JetStream stores for the set, as the runtime last found it (a write every 5 s, docs/runtime.md §6.11).
 */
export interface StoreUse {
  /** When the server was last asked, ISO 8601; `null` before the first time. */
  readonly checkedAt: string | null;
  /** Why JetStream stores nothing for the set now: the server's refusal in its words, or that it does not answer; `null` while writes are stored. */
  readonly refusing: string | null;
  /** The account's JetStream file storage: bytes used, and the account's limit (`null`: none of its own, the server's applies). */
  readonly account: { readonly bytes: number; readonly maxBytes: number | null } | null;
  /** The streams of the config the set's triggers use, by their config name. */
  readonly streams: Readonly<Record<string, StreamUse>>;
}

/** The runtime's records, kept in its own bucket `<seat>_runtime`, shared by every replica, and what JetStream stores. */
export interface RuntimeRecords {
  /** The last successful scheduled run of the function named `name`, or `null` if none. */
  lastRun(name: string): Promise<Run | null>;
  /** Events refused (not JSON, or refused by the input schema or the handler), by function of the set that takes events. */
  refusedEvents(): Promise<{ readonly count: number; readonly byFunction: Readonly<Record<string, RefusedEvents>> }>;
  /** What JetStream stores for the set now (docs/runtime.md §6.11), from memory: the runtime asks the server every 5 s. */
  store(): StoreUse;
}

/** A refusal or fault of one run: its code (docs/verb.md §4: 400 bad input, 500 a fault) and message. */
export interface Refusal {
  readonly code: number;
  readonly message: string;
}

/**
 * How one run ended: the handler's answer, with the HTTP status it asked for (`WithStatus`;
 * absent: 200) and, when someone receives it (a reply, an HTTP body, `invoke`), its JSON text; or
 * a refusal with its code.
 */
export type Outcome =
  | { readonly ok: true; readonly value: unknown; readonly status?: number; readonly text?: string }
  | { readonly ok: false; readonly error: Refusal };

/**
 * A run's input as its trigger received it: a payload's bytes (JSON; empty means `{}`), or a
 * value already read (an HTTP query).
 */
export type RawInput = { readonly data: Uint8Array } | { readonly value: unknown };
