/** What each command of `mesh-provisioner` (cli/commands/) is given by the program, and what several share. */
import { InvalidArgumentError, type Command } from "commander";
import { stringify } from "lossless-json";
import { loadConfig, openSession, type Config, type Session } from "../runtime/index.ts";

/** What a command is given: the config and the bus the program's options name. */
export interface Cli {
  /** The config of the program's `--config`. */
  config(): Promise<Config>;
  /** Runs `use` on a connection of the config's bus as the seat (the embedded server joined), named `mesh-provisioner <command>`, closed after. */
  asking(command: string, use: (nc: Session["nc"]) => Promise<void>): Promise<void>;
}

/** Adds one command to the program. */
export type AddCommand = (program: Command, cli: Cli) => void;

/** The {@link Cli} of `program`, whose options are read when a command runs. */
export function cliOf(program: Command): Cli {
  const config = () => loadConfig(program.opts<{ config: string }>().config);
  return {
    config,
    async asking(command, use) {
      const session = await openSession(await config(), { embedded: "join", name: `mesh-provisioner ${command}` });
      try {
        await use(session.nc);
      } finally {
        await session.close();
      }
    },
  };
}

/** An option's value as a whole number; refuses anything but digits. */
export const positive = (text: string) => {
  if (!/^\d+$/.test(text)) throw new InvalidArgumentError("must be a whole number");
  return Number(text);
};

/** `value` as JSON indented by two spaces: what `--json` prints; a number read as its digits (ask.ts) is written so. */
export const asJson = (value: unknown): string => stringify(value, undefined, 2) ?? "undefined";

/** Prints `value` as JSON (`--json`), else as `format` shows it now. */
export function print<T>(value: T, json: unknown, format: (value: T, now: Date) => string): void {
  console.log(json ? asJson(value) : format(value, new Date()));
}
