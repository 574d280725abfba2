import { defineFunction } from "../runtime/index.ts";
import { checkedEvent } from "../contract/events.ts";
import { applyCheck, CHECKED_SUBJECTS, nodeOfCheck } from "./_lib/checks.ts";
import { EVENTS_STREAM, notAhead, storedOf } from "./_lib/follower.ts";

/** docs/presence.md §16.5: a node says how its module's check of a provision came out; the newest result is kept. */
export default defineFunction({
  description: "Follows mesh-provisioner.checked.<node>: keeps the newest check per node, module and provision, with its streak.",
  triggers: [{ event: CHECKED_SUBJECTS, stream: EVENTS_STREAM }],
  input: checkedEvent,
  access: { writes: ["checks"], views: ["checks"] },
  handler: async (event, ctx) => {
    const node = nodeOfCheck(ctx.trigger);
    notAhead(event.at, storedOf(ctx.trigger).at);
    const change = await applyCheck(ctx.buckets.checks, node, event, ctx.views.checks.local);
    ctx.log.debug({ node, module: event.module, provision: event.provision, ok: event.ok, change }, "checked");
    return { change };
  },
});
