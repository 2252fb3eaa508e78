// The suite's output: the verdict of each target (with the waivers for defects known on the
// tested commit) and the markdown table (RESULTS.md).

import fs from "node:fs";
import { mib } from "./memory.mjs";

/**
 * Reads waivers: one `experiment | target | reason` per line (`#` comments). A waived target
 * that misses does not fail the run; it is listed as waived, with its reason.
 */
export function readWaivers(file) {
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, "utf8")
    .split("\n")
    .map((line) => line.replace(/#.*$/, "").trim())
    .filter(Boolean)
    .map((line) => {
      const [experiment, target, reason = ""] = line.split("|").map((s) => s.trim());
      return { experiment, target, reason };
    });
}

/** Marks each target `pass`, `FAIL` or `waived`; returns the misses that fail the run. */
export function judge(rows, waivers) {
  const failing = [];
  for (const row of rows) {
    for (const t of row.targets) {
      const waiver = waivers.find((w) => w.experiment === row.name && w.target === t.name);
      if (t.ok) t.verdict = waiver ? "pass (waived, met in this run)" : "pass";
      else if (waiver) t.verdict = `waived: ${waiver.reason}`;
      else {
        t.verdict = "FAIL";
        failing.push(`${row.name}: ${t.name} = ${t.value}`);
      }
    }
  }
  return failing;
}

const cell = (v) => (v === undefined || v === null ? "–" : String(v));

/** The markdown report. */
export function markdown({ rows, meta }) {
  const lines = [];
  lines.push("# Fault suite results");
  lines.push("");
  lines.push(
    `Written by \`loadtest/faults/run.sh${meta.form === "long" ? " --long" : ""}\` on commit \`${meta.commit}\`` +
      `${meta.dirty ? " (with uncommitted changes)" : ""}; the broker's source (src/, Cargo files, config/) ` +
      `is that of commit \`${meta.brokerCommit}\`. ${meta.date}, binary \`${meta.binary}\`, ${meta.cpus} CPUs, ` +
      `${Math.round(meta.seconds)} s. How to read it: [README.md](README.md).`,
  );
  lines.push("");
  lines.push(
    "| experiment | fault | acknowledged | lost silently | lost with a signal | lost though in the log | duplicated | reordered | delivered, never acknowledged | fatal answers | folds diverged | peak RSS (bound) | targets |",
  );
  lines.push("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|");
  for (const r of rows) {
    const misses = r.targets.filter((t) => !t.ok);
    const verdict =
      misses.length === 0
        ? "all met"
        : misses.map((t) => `${t.verdict.startsWith("waived") ? "waived" : "**missed**"}: ${t.name}`).join("; ");
    const rss = r.peakRss ? `${mib(r.peakRss)} (${r.bound ? mib(r.bound) : "?"})` : "–";
    lines.push(
      `| ${r.name} | ${r.fault} | ${cell(r.acknowledged)} | ${cell(r.lostSilently)} | ${cell(r.lostSignalled)} | ` +
        `${r.logKnown === false ? `${cell(r.lostInLog)}?` : cell(r.lostInLog)} | ${cell(r.duplicated)} | ${cell(r.reordered)} | ` +
        `${cell(r.neverAcked)} | ${cell(r.fatal)} | ${cell(r.diverged)} | ${rss} | ${verdict} |`,
    );
  }
  lines.push("");
  lines.push(
    "Counts are over every (subscriber, counted event) pair: an acknowledged event one of six subscribers " +
      "missed counts 1. \"Acknowledged\" counts the producers' numbered `CUSTOM` events a 2xx answer acknowledged.",
  );
  lines.push("");
  for (const r of rows) {
    lines.push(`## ${r.name}`);
    lines.push("");
    lines.push(`${r.fault}. ${r.subscribers ?? 0} subscribers judged.`);
    lines.push("");
    for (const t of r.targets) lines.push(`- ${t.name}: ${cell(t.value)} → ${t.verdict}`);
    if (r.boundParts) {
      lines.push(
        `- memory bound: ${Object.entries(r.boundParts).map(([k, v]) => `${k} ${mib(v)}`).join(" + ")} = ${mib(r.bound)}`,
      );
    }
    for (const n of r.notes) lines.push(`- note: ${n}`);
    lines.push("");
  }
  return lines.join("\n");
}
