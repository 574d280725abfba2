import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type { ChildProcess } from "node:child_process";
import type { NatsConnection } from "nats";
import { CONFIG_FILE, loadConfig, start, type Config, type Running } from "../runtime/index.ts";
import { createLogger } from "../runtime/log.ts";
import { startTestBus, type TestBus, type TestBusOptions } from "../runtime/testing.ts";
import { catchUp, type CatchUp } from "../runtime/views/freshness.ts";

export const ROOT = resolve(import.meta.dirname, "..");

/**
 * The function files the project ships (functions/_shipped.json, which the build reads too):
 * tests of the shipped set run on these alone, so a file a user drops into `functions/`
 * (README, "Adding a function") changes none of them.
 */
export const SHIPPED_FUNCTIONS: readonly string[] = JSON.parse(readFileSync(join(ROOT, "functions", "_shipped.json"), "utf8"));

/**
 * A folder of links to the shipped function files and to `functions/_lib`, under `.tmp/`, and
 * a config file next to it: the project's config with that folder as its functions. Made once
 * (each test process finds it made, or makes it and moves it in place whole).
 */
function shipped(): { functions: string; config: string } {
  const name = `shipped-${createHash("sha256").update(SHIPPED_FUNCTIONS.join()).digest("hex").slice(0, 12)}`;
  const functions = join(ROOT, ".tmp", name);
  const config = join(ROOT, ".tmp", `${name}.config.ts`);
  if (!existsSync(functions)) {
    mkdirSync(join(ROOT, ".tmp"), { recursive: true });
    const making = mkdtempSync(join(ROOT, ".tmp", "shipping-"));
    for (const file of [...SHIPPED_FUNCTIONS.map((f) => `${f}.ts`), "_lib"]) symlinkSync(join(ROOT, "functions", file), join(making, file));
    try {
      renameSync(making, functions);
    } catch {
      rmSync(making, { recursive: true, force: true }); // another process made it first
    }
  }
  if (!existsSync(config)) {
    const text =
      `import base from ${JSON.stringify(join(ROOT, CONFIG_FILE))};\n` +
      `export default { ...base, functions: ${JSON.stringify(functions)}, state: ${JSON.stringify(join(ROOT, ".state"))} };\n`;
    const making = `${config}.${process.pid}`;
    writeFileSync(making, text);
    renameSync(making, config);
  }
  return { functions, config };
}

const made = shipped();
/** The folder of the shipped function files alone ({@link SHIPPED_FUNCTIONS}). */
export const SHIPPED_DIR = made.functions;
/** The project's config file, but with {@link SHIPPED_DIR} as its functions, for tests that run the command line. */
export const SHIPPED_CONFIG = made.config;

/** The project's own config, read without the environment of whoever runs the tests, on the shipped functions alone. */
export const projectConfig = async (): Promise<Config> => ({
  ...(await loadConfig(resolve(ROOT, CONFIG_FILE), {})),
  functions: SHIPPED_DIR,
});

/** A real nats-server configured as the embedded default, for one test file. */
export async function testBus(options?: TestBusOptions): Promise<TestBus> {
  return startTestBus(await projectConfig(), options);
}

/** The fields of the project's config only its functions read: left out for a test's own function files. */
const FUNCTION_FIELDS = ["registry", "provisioning", "presence", "rotation", "alerts"] as const;

/** `config` without the fields only the project's functions read, for a set of a test's own function files. */
export function withoutFunctionFields(config: Config): Config {
  const kept: Record<string, unknown> = { ...config };
  for (const field of FUNCTION_FIELDS) delete kept[field];
  return kept as Config;
}

/**
 * A view's freshness (runtime/views/freshness.ts `catchUp`) over requests a test answers: of
 * bucket `b`, its view applied 9, its stream's last sequence 8, nothing after what it applied,
 * its leader holding nothing past 8 yet, logging nothing; each as `options` says instead.
 */
export function catchUpOf(options: Partial<Parameters<typeof catchUp>[0]> = {}): CatchUp {
  return catchUp({
    bucket: "b",
    applied: () => 9,
    probe: async () => ({ sequence: 8, askedAt: 1, heldAtAsk: 9 }),
    tail: { nothingAfter: async () => true },
    sameAfter: async () => "none",
    unavailable: () => undefined,
    wentBack: () => {},
    stuck: () => {},
    log: createLogger({ LOG_LEVEL: "silent" }),
    ...options,
  });
}

/** The project's function set, started on a test bus. */
export function startSet(bus: TestBus, overrides: Partial<Config> = {}): Promise<Running> {
  return start({ config: { ...bus.config, ...overrides } });
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A request/reply as a client sends it: the reply's JSON body and its service error headers. */
export async function request(nc: NatsConnection, subject: string, payload: unknown | Uint8Array) {
  const data = payload instanceof Uint8Array ? payload : encoder.encode(JSON.stringify(payload));
  const reply = await nc.request(subject, data, { timeout: 10_000 });
  const code = reply.headers?.get("Nats-Service-Error-Code");
  return {
    body: JSON.parse(decoder.decode(reply.data)) as any,
    bytes: reply.data.length,
    errorCode: code ? Number(code) : undefined,
    errorText: reply.headers?.get("Nats-Service-Error") || undefined,
  };
}

/**
 * Resolves with the HTTP URL a spawned `mesh-provisioner start` prints in its banner (on stderr);
 * rejects with its stderr when it exits first.
 */
export function bannerUrl(child: ChildProcess, what = "the set"): Promise<string> {
  let err = "";
  return new Promise((resolve, reject) => {
    child.stderr!.on("data", (d) => {
      err += d;
      if (/\n {2}status .*\n/.test(err)) resolve(/^HTTP {2}(\S+)$/m.exec(err)![1]!);
    });
    child.once("exit", (code, signal) => reject(new Error(`${what} exited (${code ?? signal}): ${err}`)));
  });
}

/** Waits until `check` holds, polling every 50 ms; throws after `timeoutMs` naming what was awaited. */
export async function until(check: () => boolean | Promise<boolean>, timeoutMs = 15_000, what = String(check)): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not true within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Kills with SIGKILL the process group of each child of `groups` still running (a failed test's), emptying the list. */
export function killGroups(groups: ChildProcess[]): void {
  for (const child of groups.splice(0)) {
    if (child.exitCode !== null || child.signalCode !== null) continue;
    try {
      process.kill(-child.pid!, "SIGKILL");
    } catch {
      // the group is gone already
    }
  }
}
