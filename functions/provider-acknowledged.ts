import { defineFunction } from "../runtime/index.ts";
import { EVENTS_STREAM, providerOf, storedOf } from "./_lib/follower.ts";
import { acknowledgedEvent } from "../contract/events.ts";
import { acknowledgeRelease } from "./_lib/rotation-record.ts";

/** docs/rotation.md §8.6: a provider received a release; it is published to it no more. */
export default defineFunction({
  description: "Follows <provider>.provisioner.acknowledged: a release the provider received is published to it no more.",
  triggers: [{ event: "*.provisioner.acknowledged", stream: EVENTS_STREAM }],
  input: acknowledgedEvent,
  access: { writes: ["rotations"] },
  handler: async (event, ctx) => {
    const provider = providerOf(ctx.trigger);
    const change = await acknowledgeRelease(ctx.buckets.rotations, provider, event, storedOf(ctx.trigger).at);
    ctx.log.debug({ provider, provision: event.provision, revision: event.revision, change }, "release acknowledged");
    return { change };
  },
});
