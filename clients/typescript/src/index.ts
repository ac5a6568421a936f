/**
 * A typed tokenmint client for checkout pages: the types are generated from the
 * repository's `openapi.yaml` (`schema.d.ts`, by `npm run generate`), the requests are
 * sent by openapi-fetch, and this layer adds only what a checkout needs on top: its
 * public key on every request, `Prefer: wait=N`, and the response headers a page reads.
 *
 * @module
 */
import createClient from "openapi-fetch";

import type { components, paths } from "./schema";

/** The body of `POST /v1/issuances`. */
export type IssuanceRequest = components["schemas"]["IssuanceRequest"];
/** What `POST /v1/issuances` answers 200, 201 or 202 with. */
export type IssuanceResponse = components["schemas"]["IssuanceResponse"];
/** An RFC 9457 problem: what every refusal answers with. */
export type Problem = components["schemas"]["Problem"];

/** Where the API is and the checkout key (`issuances:request`) the page ships with. */
export interface CheckoutClientOptions {
  /** The API's origin, e.g. `https://tokens.example.com`. */
  baseUrl: string;
  /** The public checkout key: it may only request issuances, never read or change tokens. */
  checkoutKey: string;
  /** Another `fetch` (tests, service workers); the global one by default. */
  fetch?: (input: Request) => Promise<Response>;
}

/**
 * The response headers a checkout acts on, as the page's script can read them. Each is
 * `null` when the answer did not carry it, and also when the API's CORS layer did not
 * expose it: a browser hides every header not listed in `Access-Control-Expose-Headers`.
 */
export interface AnswerHeaders {
  /** `wait=N` when the request was held for the payment's event. */
  preferenceApplied: string | null;
  /** `true` when this answer replays an earlier identical request. */
  idempotentReplayed: string | null;
  /** Seconds to wait before trying again (rate limited or briefly unavailable). */
  retryAfter: string | null;
  /** The request's id: quote it to support, it is on every log line of the request. */
  requestId: string | null;
}

/** An issuance request's answer: the issuance (200, 201, 202) or a problem, with headers. */
export type IssuanceAnswer =
  | { ok: true; status: number; issuance: IssuanceResponse; headers: AnswerHeaders }
  | { ok: false; status: number; problem: Problem; headers: AnswerHeaders };

/** Options of one issuance request. */
export interface RequestOptions {
  /**
   * Seconds (1 to 30) the API may hold a pending request for the payment's provider
   * event, so the page gets the tokens in one answer instead of polling.
   */
  waitSeconds?: number;
}

/** The client a checkout page uses. */
export interface CheckoutClient {
  /**
   * Requests the tokens of a payment. The payment itself is the idempotency key (the API
   * takes no `Idempotency-Key` here): sending the same request again is safe and answers
   * 200 with `Idempotent-Replayed: true` once the tokens exist.
   */
  requestIssuance(request: IssuanceRequest, options?: RequestOptions): Promise<IssuanceAnswer>;
}

/** A client for the API at `options.baseUrl`, authorised by the checkout key. */
export function createCheckoutClient(options: CheckoutClientOptions): CheckoutClient {
  const api = createClient<paths>({
    baseUrl: options.baseUrl,
    headers: { Authorization: `Bearer ${options.checkoutKey}` },
    fetch: options.fetch,
  });
  return {
    async requestIssuance(request, { waitSeconds } = {}) {
      const { data, error, response } = await api.POST("/v1/issuances", {
        body: request,
        params: { header: waitSeconds === undefined ? {} : { Prefer: `wait=${waitSeconds}` } },
      });
      const headers = answerHeaders(response);
      if (data !== undefined) {
        return { ok: true, status: response.status, issuance: data, headers };
      }
      return { ok: false, status: response.status, problem: error, headers };
    },
  };
}

function answerHeaders(response: Response): AnswerHeaders {
  return {
    preferenceApplied: response.headers.get("Preference-Applied"),
    idempotentReplayed: response.headers.get("Idempotent-Replayed"),
    retryAfter: response.headers.get("Retry-After"),
    requestId: response.headers.get("x-request-id"),
  };
}
