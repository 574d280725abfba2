import { resolve } from "node:path";
import type { NatsConnection } from "nats";
import { CONFIG_FILE, loadConfig, start, type Config, type Running } from "../runtime/index.ts";
import { startTestBus, type TestBus, type TestBusOptions } from "../runtime/testing.ts";

export const ROOT = resolve(import.meta.dirname, "..");

/** The project's own config, read without the environment of whoever runs the tests. */
export const projectConfig = (): Promise<Config> => loadConfig(resolve(ROOT, CONFIG_FILE), {});

/** A real nats-server configured as the embedded default, for one test file. */
export async function testBus(options?: TestBusOptions): Promise<TestBus> {
  return startTestBus(await projectConfig(), options);
}

/** The fields of the project's config only its functions read: left out for a test's own function files. */
const FUNCTION_FIELDS = ["registry", "provisioning", "rotation", "alerts"] as const;

/** `config` without the fields only the project's functions read, for a set of a test's own function files. */
export function withoutFunctionFields(config: Config): Config {
  const kept: Record<string, unknown> = { ...config };
  for (const field of FUNCTION_FIELDS) delete kept[field];
  return kept as Config;
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

/** Waits until `check` holds, polling every 50 ms; throws after `timeoutMs` naming what was awaited. */
export async function until(check: () => boolean | Promise<boolean>, timeoutMs = 15_000, what = String(check)): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not true within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
