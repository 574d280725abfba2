import type { NatsConnection } from "nats";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readBucket } from "../runtime/buckets.ts";
import type { TestBus } from "../runtime/testing.ts";
import { loadProgress, openView, type ProgressStream } from "../runtime/views/index.ts";
import { testBus, until } from "./helpers.ts";

// The progress of a view's load, as start says it: log lines with `loaded` rising to `of`, and
// a live line on stderr only when it is a terminal.

const KEYS = 100_000;
const BUCKET = "mesh-provisioner_progress-probe";

interface LogLine {
  readonly msg: string;
  readonly bucket?: string;
  readonly loaded?: number;
  readonly of?: number;
  readonly rate?: number;
  readonly ms?: number;
}

let bus: TestBus;
let seat: NatsConnection;

beforeAll(async () => {
  // The probe bucket is none of the config's: the seat may use any subject here.
  bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
  seat = await bus.connect();
  await seat.jetstream().views.kv(BUCKET, { history: 1, allow_direct: true });
  // Plain publishes into the bucket's stream, as a KV put does without waiting for each ack.
  const value = new TextEncoder().encode("v");
  for (let i = 0; i < KEYS; i++) seat.publish(`$KV.${BUCKET}.k.${i}`, value);
  await seat.flush();
  const jsm = await seat.jetstreamManager();
  await until(async () => (await jsm.streams.info(`KV_${BUCKET}`)).state.messages === KEYS, 60_000, "every key stored");
}, 120_000);
afterAll(async () => {
  await bus.stop();
});

/** A view of the probe bucket opened with progress told to `lines` and `stream`. */
async function loadWith(stream: ProgressStream): Promise<LogLine[]> {
  const lines: LogLine[] = [];
  const log = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
  const kv = await seat.jetstream().views.kv(BUCKET, { bindOnly: true });
  const progress = loadProgress(log, { stream, showAfterMs: 0, logEveryMs: 20, drawEveryMs: 20 });
  const view = await openView(seat, BUCKET, readBucket(kv, BUCKET), log, { progress });
  try {
    await view.loaded;
  } finally {
    view.stop();
    progress.stop();
  }
  return lines;
}

describe("a view's load at start", () => {
  it("logs `loaded` rising to `of`, the stream's keys, then one line with the keys loaded and the time", async () => {
    const lines = await loadWith({ isTTY: false, write: () => true });
    const loading = lines.filter((l) => l.msg === "loading the view");
    expect(loading.length).toBeGreaterThan(0);
    for (const line of loading) {
      expect(line.bucket).toBe(BUCKET);
      expect(line.of).toBe(KEYS);
      expect(line.loaded).toBeLessThanOrEqual(KEYS);
      expect(typeof line.rate).toBe("number");
    }
    const loaded = loading.map((l) => l.loaded!);
    expect(loaded).toEqual([...loaded].sort((a, b) => a - b));
    const done = lines.filter((l) => l.msg === "view loaded");
    expect(done).toHaveLength(1);
    expect(done[0]).toMatchObject({ bucket: BUCKET, loaded: KEYS });
    expect(typeof done[0]!.ms).toBe("number");
    expect(lines.indexOf(done[0]!)).toBe(lines.length - 1);
  }, 60_000);

  it("writes no live line when stderr is not a terminal", async () => {
    let written = "";
    await loadWith({ isTTY: false, write: (text: string) => (written += text) });
    expect(written).toBe("");
  }, 60_000);

  it("draws one line per bucket on a terminal, ending with the keys loaded", async () => {
    let written = "";
    await loadWith({ isTTY: true, write: (text: string) => (written += text) });
    const drawn = written.split("\n").filter((l) => l !== "");
    expect(drawn.length).toBeGreaterThan(0);
    expect(drawn.at(-1)).toMatch(new RegExp(`${BUCKET}  100,000 keys in \\d+\\.\\d s$`));
  }, 60_000);
});
