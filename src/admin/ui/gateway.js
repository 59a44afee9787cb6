// The gateway view: requests by outcome over the last minutes, and one
// tenant's record of a key — looked up, and purged after a confirmation.

import { call } from "./api.js";
import { clearMessage, confirm, fields, fill, row, say } from "./view.js";

// The outcomes an operator watches, each the sum of the gateway's own
// outcome names (`idemgate_requests_total{outcome}`).
const GROUPS = [
  ["All requests", null],
  ["Forwarded (first attempts)", ["forwarded", "released"]],
  ["Replayed", ["replayed"]],
  ["Conflict (409, in flight)", ["conflict"]],
  ["Mismatch (422, key reused)", ["mismatch"]],
  ["Unknown outcome held (502)", ["unknown", "held"]],
  ["Store errors (503 or fail-open)", ["store-error", "fail-open"]],
  ["Upstream errors", ["upstream-error", "timed-out"]],
  ["Webhooks refused (401)", ["webhook-signature", "webhook-timestamp"]],
];
const ATTENTION = new Set([
  "Mismatch (422, key reused)",
  "Unknown outcome held (502)",
  "Store errors (503 or fail-open)",
  "Webhooks refused (401)",
]);

function sum(minutes, names) {
  return minutes.reduce(
    (total, minute) =>
      total +
      Object.entries(minute.counts)
        .filter(([name]) => names === null || names.includes(name))
        .reduce((s, [, n]) => s + n, 0),
    0,
  );
}

export async function showOutcomes() {
  const body = document.querySelector("#outcomes tbody");
  const data = await call("GET", "/admin/gateway/outcomes", {
    notFound: "This listener is a standalone relay's: it has no gateway requests to count. Use the Outbox view.",
  });
  const minutes = data.minutes;
  const last = (n) => minutes.slice(-n);
  fill(
    body,
    ...GROUPS.map(([label, names]) => {
      const tr = row([label, sum(last(1), names), sum(last(5), names), sum(last(15), names)]);
      if (ATTENTION.has(label) && sum(last(15), names) > 0) {
        tr.querySelectorAll("td").forEach((td) => td.classList.add("attention"));
      }
      return tr;
    }),
  );
}

let current = null; // { key, tenant, path } of the record shown

function keyPath(key, tenant) {
  const query = tenant ? `?tenant=${encodeURIComponent(tenant)}` : "";
  return `/admin/keys/${encodeURIComponent(key)}${query}`;
}

function describe(record) {
  const pairs = [
    ["State", { in_flight: "in flight (an attempt holds it)", completed: "completed", unknown: "unknown outcome (sent, answer lost): retries get 502 until purged or expired" }[record.state] ?? record.state],
    ["Fingerprint", `${record.fingerprint.slice(0, 16)}…`],
    ["Scoped key", `${record.scoped_key.slice(0, 16)}…`],
  ];
  if (record.state === "in_flight") pairs.push(["Lease left", `${(record.lease_remaining_ms / 1000).toFixed(1)} s`]);
  if (record.state === "completed") {
    pairs.push(["Stored status", record.status ?? "none (too large to keep: retries get 410)"]);
    pairs.push(["Stored body", record.body_bytes === null ? "none" : `${record.body_bytes} bytes (never shown here)`]);
    pairs.push(["Replayable", record.replayable ? "yes" : "no"]);
  }
  return pairs;
}

async function lookUp(event) {
  event.preventDefault();
  clearMessage();
  const key = document.getElementById("lookup-key").value;
  const tenant = document.getElementById("lookup-tenant").value;
  document.getElementById("record").hidden = true;
  current = null;
  try {
    const record = await call("GET", keyPath(key, tenant), {
      notFound: "No record of this key for this tenant: it was never used, has expired, or the tenant differs (check it is what the tenant source reads: by default the client's exact Authorization value).",
    });
    current = { key, tenant };
    fields(document.getElementById("record-fields"), [["Key", key], ["Tenant", tenant || "(none)"], ...describe(record)]);
    document.getElementById("record").hidden = false;
  } catch (error) {
    say(error.message);
  }
}

async function purge() {
  if (!current) return;
  const { key, tenant } = current;
  const sure = await confirm(
    "Purge this key?",
    `The record of “${key}” for this tenant is deleted, stored response included. The next request with this key runs again at the upstream, as a first request: it is not replayed. Purge only when you know that running it again is what you want. This cannot be undone.`,
    "Purge",
  );
  if (!sure) return;
  try {
    await call("DELETE", keyPath(key, tenant), { notFound: "The record was already gone (expired or purged)." });
    document.getElementById("record").hidden = true;
    current = null;
    say(`Purged “${key}”. The next request with this key runs again.`, true);
  } catch (error) {
    say(error.message);
  }
}

export function wireGateway() {
  document.getElementById("lookup-form").addEventListener("submit", lookUp);
  document.getElementById("purge").addEventListener("click", purge);
}
