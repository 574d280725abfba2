/**
 * Whether JetStream stores what the set writes: the key `probe` of the runtime's bucket written
 * every 5 s and timed (the round trip every record, claim and function's write depends on), and
 * the account's storage against its limit (docs/runtime.md §6.11).
 */
import type { NatsConnection } from "nats";
import type { Logger } from "pino";
import { recordsBucket, type Config } from "./config.ts";
import { streamGone } from "./jetstream.ts";
import type { StoreUse } from "./types.ts";

/** How often the probe writes, in milliseconds. */
export const PROBE_MS = 5000;
/** Bytes an account with a limit of its own must have left, or writes are said refused: about one write. */
export const ACCOUNT_ROOM = 4096;
/** How often the probe writes while JetStream refuses or does not answer, or while the connection is away, in milliseconds. */
export const RETRY_MS = 1000;
/** How long a probe's write may go unanswered before the set says JetStream does not answer, in milliseconds. */
export const PROBE_TIMEOUT_MS = 2000;

/** What the probe found, and what it makes of it. */
export interface Capacity {
  /** The last probe's findings (the streams are the event kind's to say). */
  state(): Omit<StoreUse, "streams">;
  /** Why JetStream should not be waited for now: the last probe's write got no answer at all. */
  unanswered(): string | undefined;
  /** Why the set cannot serve as it should: JetStream refuses its writes, or does not answer them. */
  notReady(): string[];
  /** Probes now (after a reconnect); resolves once the probe is done. */
  probe(): Promise<void>;
  stop(): void;
}

/** What a JetStream publish's error says, in words an operator can act on. */
function refusalOf(
  err: Error & { code?: string; api_error?: { description?: string } },
  bucket: string,
): { reason: string; unanswered: boolean; noStream?: true } {
  if (err.code === "TIMEOUT") {
    return {
      reason: `JetStream does not answer: a write to ${bucket} got no answer within ${PROBE_TIMEOUT_MS / 1000} s`,
      unanswered: true,
    };
  }
  // A 503 without the server's error is no responders: no stream takes the subject.
  if (err.code === "503" && err.api_error === undefined) {
    return {
      reason: `JetStream stores nothing: no stream answers a write to ${bucket} (JetStream is off on the server, or the server switched it off, as it does when its disk is full)`,
      unanswered: false,
      noStream: true,
    };
  }
  // nats.js's message of a JetStream error may be its code alone ("503"); the server's words are the description.
  const said = err.api_error?.description ?? err.message;
  const full = /insufficient resources|resource limits exceeded|no space left/i.test(said);
  return {
    reason:
      `JetStream refuses to store: ${said}` +
      (full ? " (the server's max_file_store, its disk or the account's storage limit is reached: free some, or give JetStream more)" : ""),
    unanswered: false,
  };
}

/**
 * Probes the server every {@link PROBE_MS} ({@link RETRY_MS} while it refuses, does not answer or
 * `skip()` says the connection is away, when none is made): a write
 * of `probe` (`{ at }`) to `<seat>_runtime` within {@link PROBE_TIMEOUT_MS}, then the account's
 * info. Logs at `error` when JetStream stops storing and at `info` when it stores again. Never throws.
 */
export function watchCapacity(nc: NatsConnection, config: Config, log: Logger, skip: () => boolean): Capacity {
  const bucket = recordsBucket(config.seat);
  const js = nc.jetstream({ timeout: PROBE_TIMEOUT_MS });
  let state: Omit<StoreUse, "streams"> = { checkedAt: null, refusing: null, account: null };
  let unanswered: string | undefined;
  let probing: Promise<void> | undefined;
  const probe = () =>
    (probing ??= (async () => {
      const at = new Date();
      let refusing: string | null = null;
      let noStream = false;
      try {
        await js.publish(`$KV.${bucket}.probe`, JSON.stringify({ at: at.toISOString() }), { timeout: PROBE_TIMEOUT_MS });
        unanswered = undefined;
      } catch (err) {
        const said = refusalOf(err as Parameters<typeof refusalOf>[0], bucket);
        refusing = said.reason;
        unanswered = said.unanswered ? said.reason : undefined;
        noStream = said.noStream === true;
      }
      // No stream answered because the bucket itself is gone (deleted behind the set): its view
      // says so and it is made again (docs/operations.md §13.4); nothing is said of JetStream.
      if (noStream) {
        const jsm = await nc.jetstreamManager({ timeout: PROBE_TIMEOUT_MS, checkAPI: false });
        if (await streamGone(jsm, `KV_${bucket}`)) refusing = null;
      }
      let account = state.account;
      if (refusing === null || unanswered === undefined) {
        const jsm = await nc.jetstreamManager({ timeout: PROBE_TIMEOUT_MS, checkAPI: false });
        const info = await jsm.getAccountInfo().catch(() => undefined);
        if (info !== undefined) account = { bytes: info.storage, maxBytes: info.limits.max_storage > 0 ? info.limits.max_storage : null };
      }
      // The probe overwrites one key, which an account's limit lets through: the account's use says it.
      if (refusing === null && account?.maxBytes != null && account.bytes + ACCOUNT_ROOM > account.maxBytes) {
        refusing =
          `JetStream refuses to store: the account's storage is full (${account.bytes} of its ${account.maxBytes} bytes); ` +
          "writes that add data are refused (resource limits exceeded for account): free some, or raise the account's max_file";
      }
      if (refusing !== null && refusing !== state.refusing) log.error({ bucket, account }, refusing);
      if (refusing === null && state.refusing !== null) log.info({ bucket }, "JetStream stores again");
      state = { checkedAt: at.toISOString(), refusing, account };
    })()
      .catch(() => {})
      .finally(() => (probing = undefined)));
  // Every 5 s; every second while JetStream refuses or does not answer, to see it store again soon.
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const next = () => {
    if (stopped) return;
    timer = setTimeout(
      () => void (skip() ? Promise.resolve() : probe()).finally(next),
      state.refusing === null && !skip() ? PROBE_MS : RETRY_MS,
    );
    timer.unref();
  };
  void probe().finally(next);
  return {
    state: () => state,
    unanswered: () => unanswered,
    notReady: () => (state.refusing === null ? [] : [state.refusing]),
    probe,
    stop: () => {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
