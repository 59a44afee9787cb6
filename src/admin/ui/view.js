// Building the page from data: every value from the API (keys, tenants,
// destination names, last errors) goes in as text (`textContent`), never
// as markup, so nothing a client or a database holds can run here.

/** A new element with text content and optional class. */
export function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

/** Replaces a node's children. */
export function fill(node, ...children) {
  node.replaceChildren(...children);
}

/** A table row of cells; numbers are right-aligned. */
export function row(values, className) {
  const tr = el("tr", null, className);
  values.forEach((value, i) => {
    const cell = el(i === 0 ? "th" : "td", value);
    if (i === 0) cell.scope = "row";
    if (typeof value === "number") cell.classList.add("number");
    tr.append(cell);
  });
  return tr;
}

/** A definition list's term and value pairs. */
export function fields(dl, pairs) {
  fill(dl, ...pairs.flatMap(([term, value]) => [el("dt", term), el("dd", value)]));
}

/** "3 s", "4 min 10 s", "2 h 5 min", "3 d 4 h". */
export function age(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** A time from Unix milliseconds, in the browser's zone, to the second. */
export function when(unixMs) {
  if (unixMs === null || unixMs === undefined) return "–";
  return new Date(unixMs).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

const message = () => document.getElementById("message");

/** Shows a sentence at the top of the page (an error unless `ok`). */
export function say(text, ok = false) {
  const node = message();
  node.textContent = text;
  node.classList.toggle("ok", ok);
  node.hidden = false;
}

export function clearMessage() {
  message().hidden = true;
  message().textContent = "";
}

/** Asks a yes/no question in the confirm dialog; resolves true on the action button. */
export function confirm(title, text, action) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const ok = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  ok.textContent = action;
  return new Promise((resolve) => {
    const done = (answer) => {
      ok.removeEventListener("click", yes);
      cancel.removeEventListener("click", no);
      dialog.removeEventListener("cancel", no);
      dialog.close();
      resolve(answer);
    };
    const yes = () => done(true);
    const no = () => done(false);
    ok.addEventListener("click", yes);
    cancel.addEventListener("click", no);
    dialog.addEventListener("cancel", no);
    dialog.showModal();
    cancel.focus();
  });
}
