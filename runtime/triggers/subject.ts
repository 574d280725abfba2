/**
 * The `{ subject }` trigger kind: request/reply on a NATS subject. Every such trigger of the set
 * is an endpoint of one NATS service named after the seat, in the seat's queue group so replicas
 * share the requests; answers go to inboxes only (docs/runtime.md §6.3.1).
 */
import type { Service, ServiceMsg } from "nats";
import { z } from "zod";
import { errorBody, refusalMessage } from "../errors.ts";
import { jsonOf } from "../json.ts";
import { RESERVED, reserved } from "../subjects.ts";
import { bindingName, type FunctionRef, type TriggerKind } from "./kind.ts";

/** `{ subject }`: a subject without wildcards, outside the server's and the replies' spaces. */
export type SubjectTrigger = { readonly subject: string };
/** What a request's run says of it: the subject it was sent on. */
export type SubjectInfo = { readonly kind: "subject"; readonly subject: string };

const schema = z.strictObject({
  subject: z
    .string()
    .regex(/^[^\s.*>]+(\.[^\s.*>]+)*$/, "must be a NATS subject without wildcards or spaces")
    .refine((s) => !reserved(s), RESERVED),
});

/** The `$SRV` subjects of the seat's service: discovery (`PING`, `INFO`, `STATS`), all and by name. */
const serviceSubjects = (seat: string) =>
  ["PING", "INFO", "STATS"].flatMap((v) => [`$SRV.${v}`, `$SRV.${v}.${seat}`, `$SRV.${v}.${seat}.*`]);

/** What a run adds to its endpoint's `$SRV.STATS`. */
interface EndpointStats {
  /** A run took `ms` (the whole handler, awaits included); `error` when it was refused or failed. */
  ran(ms: number, error?: string): void;
}

/**
 * The `$SRV.STATS` of endpoint `name`, completed with what nats.js cannot see: it times only the
 * synchronous part of a handler and counts only errors thrown there, while ours answer later and
 * refuse by replying. Reaches into the counters of nats.js 2.x's service (`handlers[].stats`);
 * `undefined` when they are not there.
 */
function endpointStats(service: Service, name: string): EndpointStats | undefined {
  const handlers = (service as unknown as { handlers?: { name: string; stats?: Record<string, unknown> }[] }).handlers;
  const counters = handlers?.find((h) => h.name === name)?.stats as
    { processing_time: number; average_processing_time: number; num_requests: number; num_errors: number; last_error?: string } | undefined;
  if (counters === undefined || typeof counters.processing_time !== "number" || typeof counters.num_errors !== "number") return undefined;
  return {
    ran(ms, error) {
      counters.processing_time += Math.round(ms * 1e6);
      counters.average_processing_time = Math.round(counters.processing_time / Math.max(1, counters.num_requests));
      if (error !== undefined) {
        counters.num_errors++;
        counters.last_error = error;
      }
    },
  };
}

/** A schema as JSON Schema text (what it accepts, or what it gives); what JSON Schema cannot say is left open. */
function jsonSchemaOf(schema: z.core.$ZodType, io: "input" | "output"): string | undefined {
  try {
    return JSON.stringify(z.toJSONSchema(schema, { io, unrepresentable: "any" }));
  } catch {
    return undefined;
  }
}

/**
 * A request/reply function's metadata in the NATS service's description ($SRV.INFO): its
 * description, and the JSON Schema of its request and, when it declares `output`, of its answer.
 */
export function endpointMetadata(fn: FunctionRef): Record<string, string> {
  const request = jsonSchemaOf(fn.input, "input");
  const response = fn.output === undefined ? undefined : jsonSchemaOf(fn.output, "output");
  return {
    description: fn.description,
    ...(request === undefined ? {} : { request_schema: request }),
    ...(response === undefined ? {} : { response_schema: response }),
  };
}

const encoder = new TextEncoder();

function refuse(msg: ServiceMsg, code: number, message: string): void {
  msg.respondError(code, refusalMessage(message), encoder.encode(errorBody(code, message)));
}

export const subject: TriggerKind<"subject", SubjectTrigger, SubjectInfo> = {
  key: "subject",
  shape: "{ subject }",
  schema,
  exclusive: (trigger) => `subject ${trigger.subject}`,
  describe: (trigger) => `subject ${trigger.subject}`,
  asked: (targets) => [...new Set(targets.map((t) => t.trigger.subject))],
  // Serve and ask its own verbs (an operator holding the seat's credentials may), and describe the service.
  seatGrants(targets, config) {
    if (targets.length === 0) return { publish: [], subscribe: [] };
    const verbs = [...new Set(targets.map((t) => t.trigger.subject))];
    return { publish: [...verbs, ...serviceSubjects(config.seat)], subscribe: [...verbs, ...serviceSubjects(config.seat)] };
  },

  /**
   * Adds every trigger as an endpoint ({@link bindingName}) of the NATS service `<seat>` (with
   * `env.service`'s version and description), queue group `<seat>`, with {@link endpointMetadata}. Answers are the handler's value as JSON;
   * refusals carry `Nats-Service-Error-Code`/`Nats-Service-Error` and a JSON body
   * (docs/verb.md §4.3). A request whose reply subject is not an inbox is logged and not answered. Stopping takes
   * no new request and answers those in hand, for at most the grace.
   */
  async bind(targets, env) {
    if (targets.length === 0) return { stop: async () => {} };
    const service: Service = await env.nc.services.add({ name: env.config.seat, ...env.service, queue: env.config.seat });
    const inFlight = new Set<Promise<void>>();
    for (const { fn, trigger, index } of targets) {
      const name = bindingName(fn, index);
      let stats: EndpointStats | undefined;
      const answer = async (msg: ServiceMsg) => {
        const began = performance.now();
        const outcome = await env.run(fn, { data: msg.data }, { kind: "subject", subject: msg.subject });
        stats?.ran(performance.now() - began, outcome.ok ? undefined : outcome.error.message);
        if (!outcome.ok) return refuse(msg, outcome.error.code, outcome.error.message);
        const body = encoder.encode(outcome.text ?? jsonOf(outcome.value));
        try {
          msg.respond(body);
        } catch (err) {
          env.log.error({ function: fn.name, subject: msg.subject, err }, "answer not sent");
          refuse(msg, 500, `the answer (${body.length} bytes) could not be sent: ${(err as Error).message}`);
        }
      };
      service.addEndpoint(name, {
        subject: trigger.subject,
        metadata: endpointMetadata(fn),
        handler: (err, msg) => {
          if (err) return env.log.error({ function: fn.name, err }, "endpoint stopped");
          // An answer goes to an inbox only, or back through another account's import (`_R_.`,
          // the server's mapping): a reply subject such as `$KV.<bucket>.<key>` would have the
          // seat write, with its own rights, what the requester may not.
          if (!msg.reply?.startsWith("_INBOX.") && !msg.reply?.startsWith("_R_.")) {
            return env.log.warn(
              { function: fn.name, subject: msg.subject, reply: msg.reply?.slice(0, 200) },
              "request not answered: its reply subject is not an inbox",
            );
          }
          const answering: Promise<void> = answer(msg)
            .catch((e: unknown) => env.log.error({ function: fn.name, err: e }, "request not answered"))
            .finally(() => inFlight.delete(answering));
          inFlight.add(answering);
        },
      });
      stats = endpointStats(service, name);
      if (stats === undefined) env.log.warn({ endpoint: name }, "$SRV.STATS will count only what nats.js sees of this endpoint");
    }
    return {
      stop: async () => {
        await service.stop();
        let timer: NodeJS.Timeout | undefined;
        const grace = new Promise((resolve) => (timer = setTimeout(resolve, env.graceMs)));
        await Promise.race([Promise.allSettled(inFlight), grace]);
        clearTimeout(timer);
        if (inFlight.size > 0) env.log.warn({ unanswered: inFlight.size }, "stopped with requests still in hand");
      },
    };
  },
};
