import { defineFunction } from "../runtime/index.ts";
import { answerPage, answerSchema, cursorKey, provisioningRequest, requestFilters, VERB } from "./_lib/provisioning.ts";

/** The verb of SPEC §4: read-only views of the registry and of what node clients recorded. */
export default defineFunction({
  description: "Answers mesh-provisioner.provisioning: the registry, needs, applied and collect, narrowed and paged.",
  triggers: [{ subject: VERB }, { http: "GET /provisioning" }],
  input: provisioningRequest,
  output: answerSchema,
  access: { views: ["registry", "needs", "applied", "collect"] },
  handler: async (request, ctx) => {
    // One more than the page holds, to know whether keys remain.
    const reached = await ctx.views[request.what].list(requestFilters(request), { after: cursorKey(request), limit: request.limit + 1 });
    return answerPage(request, reached, ctx.limits.maxPayload);
  },
});
