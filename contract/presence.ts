/**
 * A node's presence (docs/presence.md §16.1): the value a node's client writes at its own key
 * `<node>` of the presence bucket, and how often the client library writes it.
 * Imports zod and the contract only.
 */
import * as z from "zod/mini";

/** How often the client library writes a node's presence, in seconds, unless told otherwise. */
export const PRESENCE_EVERY_SECONDS = 15;
/** The longest `client` kept, in characters. */
export const MAX_CLIENT = 256;

/** `{ everySeconds, client? }`: at least how often the node writes it, in seconds (1 to 86,400), and what writes it. */
export const presenceValue = z.object({
  everySeconds: z.number().check(z.minimum(1, "must be at least 1 second"), z.maximum(86_400, "must be at most a day")),
  client: z.optional(z.string().check(z.maxLength(MAX_CLIENT))),
});
export type PresenceValue = z.output<typeof presenceValue>;
