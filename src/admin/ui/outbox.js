// The outbox view: per destination what waits, is leased, dead or held;
// the dead rows a page at a time with their last error, and redrive of
// one row or all after a confirmation.

import { call } from "./api.js";
import { age, clearMessage, confirm, el, fields, fill, row, say, when } from "./view.js";

const PAGE = 20;
let offset = 0;

/** The destination filter's choices: "all", then every destination listed, the chosen one kept. */
function offerDestinations(names) {
  const select = document.getElementById("dead-destination");
  const chosen = select.value;
  const all = el("option", "all");
  all.value = "";
  const options = names.map((name) => {
    const option = el("option", name);
    option.value = name;
    return option;
  });
  fill(select, all, ...options);
  select.value = names.includes(chosen) ? chosen : "";
}

export async function showDestinations() {
  const body = document.querySelector("#destinations tbody");
  const note = document.getElementById("destinations-note");
  note.hidden = true;
  try {
    const data = await call("GET", "/admin/outbox/destinations", { notFound: "" });
    const line = (d, className) => {
      const tr = row([d.destination, d.ready, d.leased, d.dead, d.held, d.ready > 0 ? age(d.oldest_ready_age_seconds) : "–"], className);
      const cells = tr.querySelectorAll("td");
      if (d.dead > 0) cells[2].classList.add("attention");
      if (d.held > 0) cells[3].classList.add("attention");
      return tr;
    };
    fill(body, ...data.destinations.map((d) => line(d)), ...data.unroutable.map((d) => line(d, "unroutable")));
    offerDestinations([...data.destinations, ...data.unroutable].map((d) => d.destination));
    if (data.unroutable_total > data.unroutable.length) {
      note.textContent = `${data.unroutable_total - data.unroutable.length} more unroutable destinations are not listed.`;
      note.hidden = false;
    }
  } catch (error) {
    if (error.status !== 404) throw error;
    fill(body);
    note.textContent = "This listener has no outbox database or no [destinations] configured, so it cannot count per destination.";
    note.hidden = false;
  }
}

function deadCard(dead) {
  const li = el("li");
  li.dataset.id = String(dead.id);
  const title = el("strong", `#${dead.id} ${dead.destination} · ${dead.operation}`);
  const dl = el("dl");
  fields(dl, [
    ["Business key", dead.business_key],
    ["Attempts", dead.attempts],
    ["Enqueued", when(dead.created_at_unix_ms)],
    ["Died", when(dead.dead_at_unix_ms)],
    ["Last error", dead.last_error ?? "(none recorded)"],
    ["Trace", dead.trace_id ?? "(none)"],
  ]);
  dl.querySelectorAll("dd")[4].classList.add("error");
  li.append(title, dl);
  if (dead.holds > 0) {
    li.append(el("p", `Holds ${dead.holds} later row${dead.holds === 1 ? "" : "s"} of its ordering key: they wait until this one is redriven and delivered.`, "held"));
  }
  const redrive = el("button", "Redrive…", "danger");
  redrive.type = "button";
  redrive.addEventListener("click", () => redriveOne(dead));
  li.append(redrive);
  return li;
}

export async function showDead() {
  const list = document.getElementById("dead");
  const destination = document.getElementById("dead-destination").value;
  const only = destination ? `&destination=${encodeURIComponent(destination)}` : "";
  const data = await call("GET", `/admin/outbox/dead?limit=${PAGE}&offset=${offset}${only}`, {
    notFound: "This listener has no outbox database configured (relay.database_url).",
  });
  if (data.rows.length === 0 && offset > 0 && data.total > 0) {
    offset = Math.max(0, Math.floor((data.total - 1) / PAGE) * PAGE);
    return showDead();
  }
  fill(list, ...data.rows.map(deadCard));
  document.getElementById("dead-empty").hidden = data.total > 0;
  document.getElementById("dead-range").textContent =
    data.total > 0 ? `${offset + 1}–${offset + data.rows.length} of ${data.total}` : "";
  document.getElementById("dead-previous").disabled = offset === 0;
  document.getElementById("dead-next").disabled = offset + data.rows.length >= data.total;
  document.getElementById("redrive-all").disabled = data.total === 0;
}

export async function showOutbox() {
  await showDestinations();
  await showDead();
}

async function redriveOne(dead) {
  const sure = await confirm(
    `Redrive row #${dead.id}?`,
    `The relay sends “${dead.operation}” for “${dead.business_key}” to ${dead.destination} again, with the same Idempotency-Key, and its retry budget starts afresh. Redrive once the cause of the last error is fixed.`,
    "Redrive",
  );
  if (!sure) return;
  try {
    clearMessage();
    await call("POST", `/admin/outbox/dead/${dead.id}/redrive`, { notFound: `Row #${dead.id} is no longer dead (redriven or removed meanwhile).` });
    say(`Row #${dead.id} is back in the queue; the relay sends it again.`, true);
  } catch (error) {
    say(error.message);
  }
  await showOutbox().catch((error) => say(error.message));
}

async function redriveAll() {
  const sure = await confirm(
    "Redrive every dead row?",
    "Every dead row, of every destination, goes back in the queue and is sent again with its own Idempotency-Key; retry budgets start afresh. Rows that died for a reason not yet fixed will die again.",
    "Redrive all",
  );
  if (!sure) return;
  try {
    clearMessage();
    const { redriven } = await call("POST", "/admin/outbox/redrive");
    say(`${redriven} row${redriven === 1 ? " is" : "s are"} back in the queue.`, true);
  } catch (error) {
    say(error.message);
  }
  await showOutbox().catch((error) => say(error.message));
}

export function wireOutbox() {
  document.getElementById("redrive-all").addEventListener("click", redriveAll);
  document.getElementById("dead-destination").addEventListener("change", () => {
    offset = 0;
    showDead().catch((error) => say(error.message));
  });
  document.getElementById("dead-previous").addEventListener("click", () => {
    offset = Math.max(0, offset - PAGE);
    showDead().catch((error) => say(error.message));
  });
  document.getElementById("dead-next").addEventListener("click", () => {
    offset += PAGE;
    showDead().catch((error) => say(error.message));
  });
}
