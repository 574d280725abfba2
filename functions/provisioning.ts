import { defineFunction } from "../runtime/index.ts";
import { answerPage, answerSchema, cursorsOf, provisioningRequest, requestFilters, VERB, WHATS } from "./_lib/provisioning.ts";

/** The verb of docs/verb.md §4: read-only views of the registry and of what node clients recorded. */
export default defineFunction({
  description: "Answers mesh-provisioner.provisioning: the registry, needs, applied and collect, narrowed and paged.",
  triggers: [{ subject: VERB }, { http: "GET /provisioning" }],
  input: provisioningRequest,
  output: answerSchema,
  access: { views: WHATS },
  handler: async (request, ctx) => {
    const cursors = cursorsOf(request);
    // One more than the page holds, to know whether keys remain.
    const view = ctx.views[request.what];
    // `stale`: what the view holds now, without asking the server, and since when it is known current.
    const reached = await (request.stale ? view.local : view).list(requestFilters(request), {
      after: cursors.after,
      limit: request.limit + 1,
    });
    return answerPage(request, reached, ctx.limits.maxPayload, cursors, request.stale ? view.confirmedAt() : undefined);
  },
});
