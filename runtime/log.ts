import { pino, type Logger, type LoggerOptions } from "pino";

/** Fields never written as they are, at any depth up to three: credentials and passwords. */
const SECRET_FIELDS = ["pass", "password", "token", "creds", "seed", "authorization"];
const REDACT: LoggerOptions["redact"] = {
  paths: SECRET_FIELDS.flatMap((field) => [field, `*.${field}`, `*.*.${field}`]),
  censor: "***",
};

/**
 * The process's logger: JSON lines on stdout, readable lines when stdout is a terminal.
 * `LOG_LEVEL` sets the level (default `info`; `silent` turns logs off); throws naming the levels
 * when it is none of them. Fields named like a
 * credential (`pass`, `password`, `token`, `creds`, `seed`, `authorization`) are written `***`.
 */
export function createLogger(env: NodeJS.ProcessEnv = process.env): Logger {
  const level = env.LOG_LEVEL ?? "info";
  const levels = [...Object.keys(pino.levels.values), "silent"];
  if (!levels.includes(level)) throw new Error(`LOG_LEVEL: ${JSON.stringify(level)} is not a level (${levels.join(", ")})`);
  if (process.stdout.isTTY) {
    return pino({ level, redact: REDACT, transport: { target: "pino-pretty", options: { translateTime: "SYS:HH:MM:ss" } } });
  }
  return pino({ level, redact: REDACT });
}
