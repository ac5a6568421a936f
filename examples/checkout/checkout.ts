/**
 * The example checkout page's script: requests the payment's tokens with
 * `Prefer: wait=N` through the typed client, and shows each answer — the tokens, and the
 * headers exactly as this script could read them (a header the API's CORS layer does not
 * expose reads as null here, and shows as "null", as an absent one does).
 *
 * Every submit is one attempt, shown below the earlier ones: sending the same request
 * again shows the replay (`Idempotent-Replayed: true`) beside the first answer.
 *
 * @module
 */
import { type IssuanceAnswer, createCheckoutClient } from "../../clients/typescript/src/index";

const form = document.querySelector<HTMLFormElement>("#request")!;
const state = document.querySelector<HTMLElement>("#state")!;
const attempts = document.querySelector<HTMLElement>("#attempts")!;
// Counted at submit, not at answer: attempts sent together keep distinct numbers.
let submitted = 0;

// The query string fills the form, so a link (or a test) can point the page anywhere.
for (const [name, value] of new URLSearchParams(location.search)) {
  const input = form.elements.namedItem(name);
  if (input instanceof HTMLInputElement) input.value = value;
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  void requestTokens(new FormData(form));
});

async function requestTokens(fields: FormData): Promise<void> {
  const field = (name: string) => String(fields.get(name) ?? "");
  const client = createCheckoutClient({ baseUrl: field("api"), checkoutKey: field("key") });
  submitted += 1;
  const number = submitted;
  state.textContent = `attempt ${number}: waiting for the payment…`;
  try {
    const answer = await client.requestIssuance(
      {
        provider: field("provider"),
        accountId: field("account"),
        paymentIntentId: field("payment"),
        owner: field("owner"),
        tokenType: field("tokenType"),
        quantity: Number(field("quantity")),
      },
      // An empty wait sends no Prefer: the API answers a pending request 202 at once.
      field("wait") === "" ? {} : { waitSeconds: Number(field("wait")) },
    );
    attempts.append(shown(number, answer));
    state.textContent = `attempt ${number}: answered ${answer.status}`;
  } catch (error) {
    // fetch rejects without an answer: the network, or CORS refused the call.
    state.textContent = `attempt ${number}: failed: ${String(error)}`;
  }
}

/** One attempt's answer as the page shows it, with `data-*` names a test can read. */
function shown(number: number, answer: IssuanceAnswer): HTMLElement {
  const section = document.createElement("section");
  section.className = "attempt";
  section.dataset.attempt = String(number);
  const list = document.createElement("dl");
  const row = (name: string, label: string, value: string | null) => {
    const term = document.createElement("dt");
    term.textContent = label;
    const detail = document.createElement("dd");
    detail.dataset.field = name;
    detail.textContent = value ?? "null";
    list.append(term, detail);
  };
  row("status", "HTTP status", String(answer.status));
  if (answer.ok) {
    row("issuance", "Issuance", answer.issuance.issuance.status);
  } else {
    row("problem", "Problem", `${answer.problem.code}: ${answer.problem.detail}`);
  }
  row("preference-applied", "Preference-Applied", answer.headers.preferenceApplied);
  row("idempotent-replayed", "Idempotent-Replayed", answer.headers.idempotentReplayed);
  row("request-id", "x-request-id", answer.headers.requestId);
  // Sent only with a 429 or 503: shown when there is one.
  if (answer.headers.retryAfter !== null) {
    row("retry-after", "Retry-After", answer.headers.retryAfter);
  }
  section.append(list);
  if (answer.ok && answer.issuance.tokens.length > 0) {
    const tokens = document.createElement("ol");
    tokens.className = "tokens";
    for (const token of answer.issuance.tokens) {
      const item = document.createElement("li");
      item.dataset.tokenId = token.id;
      item.textContent = `${token.id} (${token.status})`;
      tokens.append(item);
    }
    section.append(tokens);
  }
  return section;
}
