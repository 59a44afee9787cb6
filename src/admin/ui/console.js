// The console's entry: sign-in, the two views (#gateway, #outbox) and
// refresh. No token, no view: the page asks for it first, and a refused
// token sends the operator back here with the refusal shown.

import { forget, remember, token } from "./api.js";
import { showOutcomes, wireGateway } from "./gateway.js";
import { showOutbox, wireOutbox } from "./outbox.js";
import { clearMessage, say } from "./view.js";

const VIEWS = { gateway: showOutcomes, outbox: showOutbox };
let relayOnly = false; // a standalone relay's listener: no gateway view

function viewName() {
  const name = location.hash.slice(1);
  if (relayOnly || name === "outbox") return "outbox";
  return "gateway";
}

function showSignIn() {
  document.getElementById("nav").hidden = true;
  for (const id of Object.keys(VIEWS)) document.getElementById(id).hidden = true;
  document.getElementById("sign-in").hidden = false;
  document.getElementById("token").focus();
}

async function show() {
  if (!token()) return showSignIn();
  const name = viewName();
  document.getElementById("sign-in").hidden = true;
  document.getElementById("nav").hidden = false;
  document.getElementById("show-gateway").hidden = relayOnly;
  for (const id of Object.keys(VIEWS)) {
    document.getElementById(id).hidden = id !== name;
    document.getElementById(`show-${id}`).setAttribute("aria-current", id === name ? "page" : "false");
  }
  try {
    await VIEWS[name]();
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      forget();
      showSignIn();
    } else if (name === "gateway" && error.status === 404) {
      relayOnly = true;
      return show();
    }
    say(error.message);
  }
}

function go(name) {
  clearMessage();
  if (location.hash === `#${name}`) show();
  else location.hash = name; // hashchange calls show()
}

function start() {
  document.getElementById("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token");
    remember(input.value.trim());
    input.value = "";
    clearMessage();
    show();
  });
  document.getElementById("sign-out").addEventListener("click", () => {
    forget();
    clearMessage();
    showSignIn();
  });
  document.getElementById("show-gateway").addEventListener("click", () => go("gateway"));
  document.getElementById("show-outbox").addEventListener("click", () => go("outbox"));
  document.getElementById("refresh").addEventListener("click", () => {
    clearMessage();
    show();
  });
  window.addEventListener("hashchange", show);
  wireGateway();
  wireOutbox();
  show();
}

start();
