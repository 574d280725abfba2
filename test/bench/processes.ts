/**
 * The bench's child processes: a free port, a process of this project spawned and waited for
 * until it says it is ready, and its stop. Shared by test/bench/bench.ts and
 * test/bench/follower.ts.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { resolve } from "node:path";
import { createInterface } from "node:readline";

export const ROOT = resolve(import.meta.dirname, "../..");

/** Every process {@link child} spawned, killed when this one exits. */
export const children: ChildProcess[] = [];

process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

/** A TCP port free now on the loopback. */
export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
    probe.once("error", reject);
  });

/** Spawns a process of this project and resolves once a line of its stdout or stderr matches `ready`. */
export async function child(args: string[], env: NodeJS.ProcessEnv, ready: RegExp): Promise<{ process: ChildProcess; line: string }> {
  const proc = spawn(process.execPath, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(proc);
  proc.stderr!.pipe(process.stderr);
  return new Promise((resolvePromise, reject) => {
    for (const input of [proc.stdout!, proc.stderr!]) {
      createInterface({ input }).on("line", (text) => {
        if (ready.test(text)) resolvePromise({ process: proc, line: text });
      });
    }
    proc.once("exit", (code) => reject(new Error(`${args.join(" ")} exited with ${code} before it was ready`)));
  });
}

/** Stops a child with SIGTERM and resolves once it exited. */
export async function stopChild(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill("SIGTERM");
  await exited;
}
