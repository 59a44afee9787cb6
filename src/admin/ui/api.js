// The admin API as the console calls it: the bearer token from this tab's
// sessionStorage (never a URL, never a cookie) on every call to the
// listener that served the page, and RFC 9457 problems turned into
// sentences a person can act on.

const TOKEN = "idemgate.admin-token";

export function token() {
  return sessionStorage.getItem(TOKEN);
}

export function remember(value) {
  sessionStorage.setItem(TOKEN, value);
}

export function forget() {
  sessionStorage.removeItem(TOKEN);
}

/** A refused or failed call, with `message` meant for the operator. */
export class ApiError extends Error {
  constructor(message, status, type) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

// What each problem type means to someone at this console.
const MEANINGS = {
  unauthorized: "The admin token was refused. Check it (it must be this process's admin token) and sign in again.",
  "admin-disabled": "The admin API is off: this process has no admin token configured. Set IDEMGATE__ADMIN__TOKEN or admin.token_file and restart it.",
  "store-unavailable": "The idempotency store does not answer. Nothing was changed; try again when it is back (see /readyz).",
  "outbox-unavailable": "The outbox database does not answer in time. Nothing was changed; try again when it is back (see /readyz).",
  "method-not-allowed": "This listener does not accept that call; the console and the binary may be of different versions.",
  internal: "The process failed to answer; its log says why.",
};

function explain(status, problem, notFound) {
  const type = typeof problem?.type === "string" ? problem.type.replace("urn:idemgate:problem:", "") : "";
  if (type === "not-found" && notFound) return notFound;
  if (MEANINGS[type]) return MEANINGS[type];
  if (type === "bad-request" && problem.detail) return `The request was refused: ${problem.detail}`;
  const what = problem?.title ? `${problem.title}${problem.detail ? ": " + problem.detail : ""}` : "";
  return `The admin listener answered ${status}${what ? " (" + what + ")" : ""}.`;
}

/**
 * Calls the admin API; resolves with the parsed JSON (or null for an
 * empty answer). `notFound` is the sentence for a 404 in this context.
 */
export async function call(method, path, { notFound } = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: { Authorization: `Bearer ${token() ?? ""}`, Accept: "application/json, application/problem+json" },
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
  } catch {
    throw new ApiError("The admin listener cannot be reached. Is the process running?", 0, "network");
  }
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const type = typeof body?.type === "string" ? body.type.replace("urn:idemgate:problem:", "") : "";
    throw new ApiError(explain(response.status, body, notFound), response.status, type);
  }
  return body;
}
