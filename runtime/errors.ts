/**
 * The runtime's errors and how a refusal is said: the service error a handler throws on purpose
 * (nats.js's own, so the side that asks reads it back with `ServiceError.toServiceError`), the
 * access error of a function using what it did not declare, the lost compare-and-set, and the
 * one-line texts of refusals. A leaf: it imports nothing of the runtime.
 */
import { ServiceError } from "nats";
import type { z } from "zod";

/**
 * An error a handler throws on purpose: nats.js's `ServiceError`, `code` the NATS service error
 * code (and HTTP status) of the refusal, `message` what the caller is told. 400 is bad input,
 * 500 a fault (docs/verb.md §4). A client reads one back from a reply with `ServiceError.toServiceError(msg)`.
 */
export { ServiceError };

/** A 400 refusal: the caller sent something this function does not take. */
export function badInput(message: string): ServiceError {
  return new ServiceError(400, message);
}

/** The longest refusal message sent, in characters: a refusal must fit in any reply. */
export const MAX_MESSAGE = 1024;

/** A refusal message as sent: one line, at most {@link MAX_MESSAGE} characters. */
export function refusalMessage(message: string): string {
  const line = message.replace(/[\r\n]+/g, " ");
  return line.length <= MAX_MESSAGE ? line : `${line.slice(0, MAX_MESSAGE - 1)}…`;
}

/** The JSON body of a refusal (docs/verb.md §4), its message cut by {@link refusalMessage}. */
export function errorBody(code: number, message: string): string {
  return JSON.stringify({ error: { code, message: refusalMessage(message) } });
}

/**
 * Says a zod error in one line a caller can act on: each problem as `<field path>: <message>`,
 * joined by `; `. An unknown key is said as `<key>: unknown field`, a refused record key by its
 * schema's message; a problem with the whole
 * value is said without a path.
 */
export function formatIssues(issues: readonly z.core.$ZodIssue[]): string {
  // A field name that is not plain is quoted, so white space or punctuation in it shows.
  const name = (key: PropertyKey) =>
    typeof key === "number" || (typeof key === "string" && /^[A-Za-z0-9_-]+$/.test(key)) ? String(key) : JSON.stringify(String(key));
  return issues
    .flatMap((issue) => {
      const at = issue.path.map(name);
      if (issue.code === "unrecognized_keys") {
        return issue.keys.map((key) => `${[...at, name(key)].join(".")}: unknown field`);
      }
      if (issue.code === "invalid_key") {
        // A record's key refused by its schema: say that schema's own words.
        return [`${at.join(".")}: ${issue.issues.map((inner) => inner.message).join("; ")}`];
      }
      return [at.length > 0 ? `${at.join(".")}: ${issue.message}` : issue.message];
    })
    .join("; ");
}

/**
 * A function used what it did not declare in `access` (docs/runtime.md §6): a bucket it does not read or
 * write, a write through a read handle, a subject it does not publish. Raised in-process,
 * before anything reaches the server; the message names the function and the bucket or subject.
 */
export class AccessError extends Error {
  override readonly name = "AccessError";
}

/** A compare-and-set write lost: the key changed since the revision it was based on. */
export class RevisionConflict extends Error {
  override readonly name = "RevisionConflict";
  constructor(
    readonly bucket: string,
    readonly key: string,
    options?: ErrorOptions,
  ) {
    super(`${bucket}: ${key} changed since it was read`, options);
  }
}

/** What was thrown, as text: an error's message (or any object's string `message`), else the value as a string, else that it has none. */
export function thrownText(err: unknown): string {
  try {
    if (err instanceof Error) return String(err.message);
    const message = typeof err === "object" && err !== null ? (err as { message?: unknown }).message : undefined;
    return typeof message === "string" ? message : String(err);
  } catch {
    return "a value that cannot be said as text";
  }
}
