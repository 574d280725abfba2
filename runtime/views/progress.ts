/**
 * The progress of the views' loads at start (docs/runtime.md §6.5.1): once a load has taken
 * longer than {@link SHOW_AFTER_MS}, a live line per bucket on a terminal (keys loaded of the
 * stream's keys, and the rate) and a log line every {@link LOG_EVERY_MS} per bucket still
 * loading; when done, one log line per bucket with its time. It knows counts and buckets only,
 * nothing of what the buckets hold.
 */
import type { Logger } from "pino";

/** How long a load runs before its progress is shown, in milliseconds. */
export const SHOW_AFTER_MS = 1000;
/** How often a load still running is logged, in milliseconds. */
export const LOG_EVERY_MS = 5000;
/** How often the terminal's lines are drawn again, in milliseconds. */
export const DRAW_EVERY_MS = 200;

/** One load of a bucket, as its progress is told. */
export interface LoadCount {
  readonly bucket: string;
  /** The keys the stream held at the start of the load (its subjects, from stream info). */
  readonly of: number;
  /** The keys applied so far. */
  loaded(): number;
}

/** The progress of the loads under way. */
export interface Progress {
  /** Follows `load` from now; the returned function says it is done (logged, drawn once more). */
  track(load: LoadCount): () => void;
  /** Stops the timers (loads that failed are left unsaid). */
  stop(): void;
}

/** Where the live lines go: a terminal when `isTTY`; nothing is written to any other. */
export interface ProgressStream {
  readonly isTTY?: boolean;
  write(text: string): unknown;
}

export interface ProgressOptions {
  /** `process.stderr` by default. */
  readonly stream?: ProgressStream;
  readonly showAfterMs?: number;
  readonly logEveryMs?: number;
  readonly drawEveryMs?: number;
}

const count = (n: number) => n.toLocaleString("en-US");
const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/**
 * Tells the progress of loads: logs `{ bucket, loaded, of, rate }` ("loading the view", rate in
 * keys per second since the load began) at info for every load running longer than
 * `showAfterMs`, then every `logEveryMs`; logs `{ bucket, loaded, ms }` ("view loaded") when
 * each is done. On a terminal `stream`, draws one line per bucket, rewritten in place every
 * `drawEveryMs`, from `showAfterMs` after the first load began until the last is done.
 */
export function loadProgress(
  log: Logger,
  { stream = process.stderr, showAfterMs = SHOW_AFTER_MS, logEveryMs = LOG_EVERY_MS, drawEveryMs = DRAW_EVERY_MS }: ProgressOptions = {},
): Progress {
  interface Tracked {
    readonly load: LoadCount;
    readonly began: number;
    done?: number;
    timer?: NodeJS.Timeout;
  }
  const tracked: Tracked[] = [];
  const tty = stream.isTTY === true;
  let drawn = 0;
  let drawTimer: NodeJS.Timeout | undefined;
  let showTimer: NodeJS.Timeout | undefined;

  const rateOf = (t: Tracked, now: number) => Math.round(t.load.loaded() / Math.max((now - t.began) / 1000, 0.001));
  const lineOf = (t: Tracked, now: number) => {
    const name = t.load.bucket.padEnd(Math.max(...tracked.map((x) => x.load.bucket.length)));
    if (t.done !== undefined) return `${name}  ${count(t.load.loaded())} keys in ${seconds(t.done - t.began)}`;
    return `${name}  ${count(t.load.loaded())} of ${count(t.load.of)} keys  ${count(rateOf(t, now))} keys/s`;
  };
  const draw = () => {
    const now = performance.now();
    // Back to the first line drawn, then each line cleared and written again.
    const up = drawn > 0 ? `\x1b[${drawn}F` : "";
    stream.write(up + tracked.map((t) => `\x1b[2K${lineOf(t, now)}\n`).join(""));
    drawn = tracked.length;
  };
  const logged = (t: Tracked) => {
    const now = performance.now();
    log.info({ bucket: t.load.bucket, loaded: t.load.loaded(), of: t.load.of, rate: rateOf(t, now) }, "loading the view");
  };
  const stopTimers = () => {
    clearTimeout(showTimer);
    clearInterval(drawTimer);
    showTimer = drawTimer = undefined;
  };

  return {
    track(load) {
      const t: Tracked = { load, began: performance.now() };
      tracked.push(t);
      t.timer = setTimeout(() => {
        logged(t);
        t.timer = setInterval(() => logged(t), logEveryMs);
        t.timer.unref();
      }, showAfterMs);
      t.timer.unref();
      if (tty && showTimer === undefined && drawTimer === undefined && drawn === 0) {
        showTimer = setTimeout(() => {
          draw();
          drawTimer = setInterval(draw, drawEveryMs);
          drawTimer.unref();
        }, showAfterMs);
        showTimer.unref();
      }
      return () => {
        if (t.done !== undefined) return;
        t.done = performance.now();
        clearTimeout(t.timer);
        clearInterval(t.timer);
        log.info({ bucket: load.bucket, loaded: load.loaded(), ms: Math.round(t.done - t.began) }, "view loaded");
        if (tracked.every((x) => x.done !== undefined)) {
          if (drawn > 0) draw();
          stopTimers();
        }
      };
    },
    stop() {
      stopTimers();
      for (const t of tracked) {
        clearTimeout(t.timer);
        clearInterval(t.timer);
      }
    },
  };
}
