/**
 * The client's errors: one class per way a call or an acquisition can fail.
 */

/**
 * The server answered with a non-retryable error (a 4xx other than 429, or 500),
 * for a whole call or, in a batch, for one item. `field` names the bad input
 * field when the server said which.
 */
export class RejectedError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly field?: string,
  ) {
    super(`${status} ${code}: ${message}${field === undefined ? "" : ` (field ${field})`}`);
    this.name = "RejectedError";
  }
}

/** The per-call deadline passed while the call was still being retried. */
export class DeadlineExceededError extends Error {
  constructor(
    readonly deadlineMs: number,
    readonly attempts: number,
    readonly last: string,
  ) {
    super(`no answer within ${deadlineMs} ms after ${attempts} attempts; last error: ${last}`);
    this.name = "DeadlineExceededError";
  }
}

/** The server answered 2xx with a body that is not the expected shape. */
export class UnexpectedAnswerError extends Error {
  constructor(
    readonly url: string,
    readonly reason: string,
  ) {
    super(`unexpected answer from ${url}: ${reason}`);
    this.name = "UnexpectedAnswerError";
  }
}

/** Why an acquisition gave up; whatever was granted by then was released. */
export class AcquireError extends Error {
  constructor(
    readonly kind: "zero_count" | "not_permitted" | "timeout" | "aborted",
    readonly key: string,
    message: string,
  ) {
    super(message);
    this.name = "AcquireError";
  }
}
