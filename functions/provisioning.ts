import { defineFunction } from "../runtime/index.ts";
import {
  answerPage,
  answerSchema,
  answerStatePage,
  cursorsOf,
  provisioningRequest,
  requestFilters,
  STATE,
  VERB,
  WHATS,
  type BucketRequest,
} from "./_lib/provisioning.ts";
import { currentModel, provisioningConfig, snapshotsOf } from "./_lib/state.ts";

/** The verb of docs/verb.md §4: read-only views of the registry and of what node clients recorded, and the module states of docs/state.md §7. */
export default defineFunction({
  description:
    "Answers mesh-provisioner.provisioning: the registry, needs, applied and collect, and each module's state, narrowed and paged.",
  triggers: [{ subject: VERB }, { http: "GET /provisioning" }],
  input: provisioningRequest,
  output: answerSchema,
  config: provisioningConfig,
  access: { views: [...WHATS, "assignments", "failing"] },
  handler: async (request, ctx) => {
    const cursors = cursorsOf(request);
    if (request.what === STATE) {
      const { graceSeconds } = ctx.config.provisioning;
      const model = await currentModel(await snapshotsOf(ctx.views, request.stale), graceSeconds);
      const confirmedAt = request.stale ? ctx.views.needs.confirmedAt() : undefined;
      return answerStatePage(request, model, ctx.clock.now(), graceSeconds, ctx.limits.maxPayload, cursors, confirmedAt);
    }
    const asked = request as BucketRequest;
    // One more than the page holds, to know whether keys remain.
    const view = ctx.views[asked.what];
    // `stale`: what the view holds now, without asking the server, and since when it is known current.
    const reached = await (request.stale ? view.local : view).list(requestFilters(asked), {
      after: cursors.after,
      limit: request.limit + 1,
    });
    return answerPage(asked, reached, ctx.limits.maxPayload, cursors, request.stale ? view.confirmedAt() : undefined);
  },
});
