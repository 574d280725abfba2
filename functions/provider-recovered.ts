import { defineFunction } from "../runtime/index.ts";
import { recoveredEvent } from "../contract/events.ts";
import { applyEvent, EVENTS_STREAM, notAhead, storedOf, providerOf } from "./_lib/follower.ts";

/** docs/failing.md §5: a provider says it serves a consumer on a machine again; its failing is removed. */
export default defineFunction({
  description: "Follows <provider>.provisioner.recovered: removes a failing older than the recovery.",
  triggers: [{ event: "*.provisioner.recovered", stream: EVENTS_STREAM }],
  input: recoveredEvent,
  access: { writes: ["failing"], views: ["failing"] },
  handler: async (event, ctx) => {
    const provider = providerOf(ctx.trigger);
    notAhead(event.at, storedOf(ctx.trigger).at);
    const change = await applyEvent(ctx.buckets.failing, provider, { kind: "recovered", event }, ctx.views.failing.local);
    ctx.log.debug({ provider, machine: event.machine, consumer: event.consumer, change }, "recovered");
    return { change };
  },
});
