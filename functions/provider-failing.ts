import { defineFunction } from "../runtime/index.ts";
import { failingEvent } from "../contract/events.ts";
import { applyEvent, EVENTS_STREAM, notAhead, storedOf, providerOf } from "./_lib/follower.ts";

/** docs/failing.md §5: a provider says it fails a consumer on a machine; the newest word is kept. */
export default defineFunction({
  description: "Follows <provider>.provisioner.failing: keeps the newest failing word per provider, machine and consumer.",
  triggers: [{ event: "*.provisioner.failing", stream: EVENTS_STREAM }],
  input: failingEvent,
  access: { writes: ["failing"], views: ["failing"] },
  handler: async (event, ctx) => {
    const provider = providerOf(ctx.trigger);
    notAhead(event.at, storedOf(ctx.trigger).at);
    const change = await applyEvent(ctx.buckets.failing, provider, { kind: "failing", event }, ctx.views.failing.local);
    ctx.log.debug({ provider, machine: event.machine, consumer: event.consumer, change }, "failing");
    return { change };
  },
});
