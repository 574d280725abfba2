/**
 * A handler's answer already written as JSON text: the runtime sends it as it is, never
 * serialising it again (replies, HTTP bodies); `invoke` hands back what it parses to. The text
 * must be one JSON value.
 */
export class JsonText {
  constructor(readonly text: string) {}
}

/**
 * A handler's answer as an HTML document (docs/runtime.md §6.2.1): an HTTP trigger sends `text` as
 * it is with `content-type: text/html; charset=utf-8`; a reply, `invoke` and an event see the
 * text as one JSON string.
 */
export class HtmlText {
  constructor(readonly text: string) {}
}

/**
 * The JSON text of a handler's answer: a {@link JsonText} as it is, an {@link HtmlText} as a JSON
 * string, anything else serialised (`undefined` as `null`). Throws a `TypeError` for a value
 * JSON cannot write (a BigInt, a cycle, a function, a symbol) and what a `toJSON` throws.
 */
export function jsonOf(value: unknown): string {
  if (value instanceof JsonText) return value.text;
  const text = JSON.stringify(value instanceof HtmlText ? value.text : (value ?? null)) as string | undefined;
  if (text === undefined) throw new TypeError(`a ${typeof value} is no JSON value`);
  return text;
}

/**
 * A handler's answer with the HTTP status its HTTP triggers answer it with
 * (docs/runtime.md §6.2.1): `value` is the answer as any other (a {@link JsonText} too); over NATS, to `invoke`
 * and to events it is `value` alone. `status` is a whole number from 200 to 599; any other
 * throws a `RangeError` naming it.
 */
export class WithStatus<T = unknown> {
  constructor(
    readonly status: number,
    readonly value: T,
  ) {
    if (!Number.isInteger(status) || status < 200 || status > 599) {
      throw new RangeError(`an HTTP status must be a whole number from 200 to 599, not ${status}`);
    }
  }
}
