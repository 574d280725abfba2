/**
 * A handler's answer already written as JSON text: the runtime sends it as it is, never
 * serialising it again (replies, HTTP bodies); `invoke` hands back what it parses to. The text
 * must be one JSON value.
 */
export class JsonText {
  constructor(readonly text: string) {}
}

/** The JSON text of a handler's answer: a {@link JsonText} as it is, anything else serialised (`undefined` as `null`). */
export const jsonOf = (value: unknown): string => (value instanceof JsonText ? value.text : JSON.stringify(value ?? null));
