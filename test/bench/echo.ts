/**
 * The bench's `echo` baseline: a bare nats.js request/reply responder in its own process, as
 * the function set runs in its own. Answers every request on `bench.echo` (queue group `echo`)
 * with its payload. Connects to NATS_URL as NATS_USER / NATS_PASSWORD; prints `ready` once
 * subscribed.
 */
import { connect } from "nats";

const nc = await connect({ servers: process.env.NATS_URL, user: process.env.NATS_USER, pass: process.env.NATS_PASSWORD });
nc.subscribe("bench.echo", { queue: "echo", callback: (_err, msg) => msg.respond(msg.data) });
await nc.flush();
console.log("ready");
process.on("SIGTERM", () => void nc.close().then(() => process.exit(0)));
