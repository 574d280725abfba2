import { pino, type Logger } from "pino";

/**
 * The process's logger: JSON lines on stdout, readable lines when stdout is a terminal.
 * `LOG_LEVEL` sets the level (default `info`; `silent` turns logs off).
 */
export function createLogger(env: NodeJS.ProcessEnv = process.env): Logger {
  const level = env.LOG_LEVEL ?? "info";
  if (process.stdout.isTTY) {
    return pino({ level, transport: { target: "pino-pretty", options: { translateTime: "SYS:HH:MM:ss" } } });
  }
  return pino({ level });
}
