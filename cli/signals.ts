/** The signals that stop a long-running command (`start`, `cluster`), and when a repeat is the same stop. */

/** SIGINT (Ctrl-C), SIGTERM (a supervisor) and SIGHUP (a closed terminal). */
export const STOP_SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;

/** How long after the first stop signal another one is the same stop, in milliseconds. */
export const SIGNAL_BURST_MS = 1000;

/**
 * Calls `stop` on the first of {@link STOP_SIGNALS}; a stop signal within {@link SIGNAL_BURST_MS}
 * of it is the same stop and is ignored; one after that exits at once with 130, `exit` hooks
 * running (docs/runtime.md §6.5). Under `npm start` one Ctrl-C, or one SIGTERM to the process
 * group, arrives twice within milliseconds: from the terminal or supervisor, and forwarded by npm.
 */
export function onStopSignals(stop: (signal: NodeJS.Signals) => void): void {
  let first: number | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    if (first === undefined) {
      first = performance.now();
      stop(signal);
    } else if (performance.now() - first > SIGNAL_BURST_MS) {
      process.exit(130);
    }
  };
  for (const signal of STOP_SIGNALS) process.on(signal, onSignal);
}
