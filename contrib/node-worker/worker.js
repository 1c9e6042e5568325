'use strict';
// A soniq_django worker in Node, built on the SQL claim protocol alone
// (docs/claim-protocol.md). Copy it as the skeleton of a worker in any
// language: every call below is one SQL function its role may EXECUTE
// (`manage.py soniq_grant --worker ROLE`), and nothing touches a table.
//
//   node worker.js ./handlers.js        (DATABASE_URL or the PG* variables)
//
// A handlers module exports { 'job.name': { run, transactional, maxAttempts } }:
//   run(args, { job, signal, client }) returns the job's result (JSON);
//   transactional: run gets `client` inside a transaction, and soniq_complete
//     is that transaction's last statement: its writes commit with the
//     completion, or not at all (effects exactly once);
//   signal aborts with reason 'cancel' (soniq_request_cancel) or 'lost' (the
//     claim lapsed: nothing this run writes will be accepted).

const crypto = require('node:crypto');
const os = require('node:os');
const { Pool } = require('pg');

const LABEL = 'soniq node worker 1.0';
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// What a failed call means (docs/claim-protocol.md, "Errors").
function outcomeOf(err) {
  const code = err && err.code;
  if (!code || !/^[0-9A-Z]{5}$/.test(code)) return 'unknown'; // the connection broke
  if (code === '55P03' || code === '57014') return 'nothing'; // our own bound: rolled back
  if (code === '55000' && err.hint) return 'refused'; // the protection trigger said no
  if (/^(08|40|53|55|57|58)/.test(code)) return 'unknown';
  return 'refused'; // a constraint, a trigger, bad input: the same call gets the same answer
}

class Worker {
  constructor({ pool, handlers, queues = null, leaseSeconds = 30, heartbeatSeconds = 10,
    pollSeconds = 5, log = (event) => console.log(JSON.stringify(event)) }) {
    Object.assign(this, { pool, handlers, queues, leaseSeconds, heartbeatSeconds, pollSeconds, log });
    this.id = crypto.randomUUID(); // a uuid: jobs then name this worker (soniq_jobs.worker_id)
    // A connection that breaks while checked out rejects the query in flight; without
    // a listener its 'error' event would end the process.
    pool.on('connect', (client) => client.on('error', () => {}));
    this.stopping = false;
    this.wake = () => {};
  }

  // One call, answered: an unknown outcome (no answer within answerWait(), a broken
  // connection) is asked again until the database answers.
  // bounded: each try waits for a lock at most lockWait() (55P03, nothing done: asked again).
  async call(sql, params, bounded = false) {
    for (let delay = 100; ; delay = Math.min(delay * 2, 2000)) {
      try {
        if (bounded) return await this.inBounds(sql, params);
        return (await this.pool.query({ text: sql, values: params,
          query_timeout: this.answerWait() })).rows;
      } catch (err) {
        if (outcomeOf(err) === 'refused') throw err;
        this.log({ event: 'retry', sql: sql.slice(0, 40), code: err.code || 'connection' });
        await sleep(delay);
      }
    }
  }

  // How long a call waits for any one lock: a sixteenth of the lease, as soniq_worker's
  // (docs/internals.md, "The bound of every wait"); its statement, twice that.
  lockWait() {
    return Math.max(1, Math.round((this.leaseSeconds * 1000) / 16));
  }

  // lock_timeout and statement_timeout for the rest of the transaction: local settings,
  // which leave nothing on the session (safe behind a transaction pooler).
  boundsSql() {
    const ms = this.lockWait();
    return `SELECT set_config('lock_timeout', '${ms}', true), `
      + `set_config('statement_timeout', '${2 * ms}', true)`;
  }

  // How long any one round trip may go unanswered (a stalled server, a path that hangs:
  // TCP sees nothing wrong, and no server-side timeout can end that wait). Past it the
  // call's outcome is unknown and its connection is dropped.
  answerWait() {
    return 4 * this.lockWait();
  }

  // A call that may wait for a lock (soniq_heartbeat, the final writes, soniq_claim_outcome)
  // within boundsSql()'s bounds: in a transaction of its own (BEGIN and the bounds in one
  // round trip), ended by a COMMIT for a write and a ROLLBACK for a read; every round trip
  // answered within answerWait(). Its values stay parameters: a claim token is never written
  // into the SQL text, which pg_stat_activity and the server's logs show.
  async inBounds(sql, params, { write = false } = {}) {
    const client = await this.pool.connect();
    const query_timeout = this.answerWait();
    let clean = false;
    try {
      await client.query({ text: `BEGIN; ${this.boundsSql()}`, query_timeout });
      const { rows } = await client.query({ text: sql, values: params, query_timeout });
      await client.query({ text: write ? 'COMMIT' : 'ROLLBACK', query_timeout });
      clean = true;
      return rows;
    } finally {
      client.release(!clean); // a connection in an unknown state is not reused
    }
  }

  async register() {
    const names = Object.keys(this.handlers);
    const limits = names.map((name) => this.handlers[name].maxAttempts ?? null);
    await this.call(
      'SELECT soniq_register_worker($1, $2, $3, $4, $5, $6, $7, 1)',
      [this.id, this.queues || [], names, os.hostname(), process.pid, LABEL, limits]);
  }

  async beatWorker(status = 'active') {
    const [{ alive }] = await this.call(
      'SELECT soniq_worker_heartbeat($1, $2) AS alive', [this.id, status]);
    if (!alive && status === 'active') await this.register(); // our row was replaced
  }

  // Claim one job under a fresh nonce; after an unknown outcome, recover it by that nonce.
  // The job carries when its claim was sent (sentAt): its lease began no earlier.
  async claim() {
    const nonce = crypto.randomUUID();
    const sentAt = performance.now();
    const claim = {
      text: 'SELECT * FROM soniq_claim($1, $2, $3, $4, pid => $5)',
      values: [this.id, nonce, this.queues, this.leaseSeconds, process.pid],
      query_timeout: this.answerWait(),
    };
    let job;
    try {
      job = (await this.pool.query(claim)).rows[0] || null;
    } catch (err) {
      const outcome = outcomeOf(err);
      if (outcome === 'refused') throw err;
      if (outcome === 'nothing') return null;
      const rows = await this.call('SELECT * FROM soniq_recover_claim($1, $2)', [this.id, nonce]);
      this.log({ event: 'recovered-claim', found: rows.length });
      job = rows[0] || null;
    }
    return job && Object.assign(job, { sentAt });
  }

  fence(job) {
    return [job.job_id, this.id, job.generation, job.token, job.queue];
  }

  // After a write whose answer was lost: what became of this claim? soniq_claim_outcome
  // locks the job's row, so it waits for a transaction of this claim still holding it (a
  // COMMIT lost on the way, which the server ends after a third of the lease: see
  // runInTransaction); each try waits at most lockWait(), and is asked again.
  async settle(job) {
    const [row] = await this.call('SELECT * FROM soniq_claim_outcome($1, $2, $3, $4)',
      this.fence(job).slice(0, 4), true);
    return row.outcome;
  }

  // A final write (soniq_complete, soniq_fail, soniq_defer, soniq_acknowledge_cancel):
  // true when it applied, false when the claim is no longer ours.
  async finish(fn, job, extra = []) {
    const args = [...this.fence(job), ...extra];
    const marks = args.map((_, i) => `$${i + 1}`).join(', ');
    for (;;) {
      try {
        const [{ ok }] = await this.inBounds(`SELECT ${fn}(${marks}) AS ok`, args,
          { write: true });
        return ok;
      } catch (err) {
        if (outcomeOf(err) === 'refused') throw err;
        const outcome = await this.settle(job);
        if (outcome !== 'live') return outcome !== 'unknown' && outcome !== 'lapsed';
      }
    }
  }

  // Renew the lease every third of it; hear a cancel request; notice a lost claim. Each
  // beat is bounded (inBounds: a lock wait, every answer); a beat still running skips the
  // next ones instead of piling them onto the pool, whose few connections the run needs
  // too. The lease is also kept on this side: when no renewal sent within the last lease
  // has been answered, the claim may have lapsed (the database ends it by its own clock),
  // so the run is told it is lost rather than run on past its lease unknowing.
  keepAlive(job, abort) {
    const leaseMs = this.leaseSeconds * 1000;
    let renewedAt = job.sentAt ?? performance.now(); // a lease runs from no earlier than this
    let beating = false;
    const lapsed = () => performance.now() - renewedAt >= leaseMs;
    const timer = setInterval(async () => {
      if (beating) {
        if (lapsed()) abort.abort('lost');
        return;
      }
      beating = true;
      const sentAt = performance.now();
      try {
        const [{ ok }] = await this.inBounds(
          'SELECT soniq_heartbeat($1, $2, $3, $4, $5, $6) AS ok',
          [...this.fence(job), this.leaseSeconds], { write: true });
        if (!ok) return abort.abort('lost');
        renewedAt = sentAt;
        const [state] = (await this.pool.query({
          text: 'SELECT cancel_requested FROM soniq_get_state($1, $2, $3, $4, $5)',
          values: this.fence(job), query_timeout: this.answerWait() })).rows;
        if (state && state.cancel_requested) abort.abort('cancel');
      } catch (err) { // the next beat tries again, within the lease
        this.log({ event: 'beat-failed', job: job.job_id, code: err.code || 'no answer' });
        if (lapsed()) abort.abort('lost');
      } finally {
        beating = false;
      }
    }, leaseMs / 3);
    return () => clearInterval(timer);
  }

  async run(job) {
    const handler = this.handlers[job.job_name];
    if (!handler) { // another worker knows it: give the claim back, no attempt spent
      const ok = await this.finish('soniq_defer', job, ['no handler in this node worker', 5]);
      return this.log({ event: 'deferred', job: job.job_id, ok });
    }
    const abort = new AbortController();
    const stop = this.keepAlive(job, abort);
    try {
      const ended = handler.transactional
        ? await this.runInTransaction(job, handler, abort.signal)
        : await this.runPlain(job, handler, abort.signal);
      this.log({ event: ended, job: job.job_id, generation: Number(job.generation) });
    } finally {
      stop();
    }
  }

  async runPlain(job, handler, signal) {
    let result;
    try {
      result = await handler.run(job.args, { job, signal });
    } catch (err) {
      return this.afterError(job, err, signal);
    }
    const ok = await this.finish('soniq_complete', job, [JSON.stringify(result ?? null)]);
    return ok ? 'completed' : 'refused';
  }

  // The handler's writes and soniq_complete in one transaction; after a COMMIT
  // whose answer was lost, soniq_claim_outcome says whether it landed.
  async runInTransaction(job, handler, signal) {
    for (;;) {
      const client = await this.pool.connect();
      let step = 'handler';
      let ok;
      try {
        await client.query('BEGIN');
        const result = await handler.run(job.args, { job, signal, client });
        step = 'complete';
        // The completion waits for the job's row at most lockWait(); and should the COMMIT's
        // answer be lost while the server keeps the transaction open (a partition), the
        // server ends it after a third of the lease, and settle() waits no longer than that.
        // Each of these round trips is answered within answerWait(), or its outcome is
        // unknown (a server or path that stalls) and settle() finds out.
        const query_timeout = this.answerWait();
        await client.query({ text: `${this.boundsSql()}, set_config(`
          + `'idle_in_transaction_session_timeout', '${Math.round(this.leaseSeconds * 1000 / 3)}', true)`,
        query_timeout });
        [{ ok }] = (await client.query({
          text: 'SELECT soniq_complete($1, $2, $3, $4, $5, $6) AS ok',
          values: [...this.fence(job), JSON.stringify(result ?? null)], query_timeout })).rows;
        step = 'commit';
        await client.query({ text: ok ? 'COMMIT' : 'ROLLBACK', query_timeout });
        client.release();
      } catch (err) {
        client.release(true); // never reuse a connection whose transaction state is unknown
        const kind = outcomeOf(err);
        // The handler's own error (thrown, a refused statement, or one past its own
        // lock_timeout or statement_timeout, 55P03 or 57014) is its failure, with an attempt
        // spent; running it again in place would meet the same bound, forever.
        if (step === 'handler' && (!err || !err.code || kind === 'nothing')) {
          return this.afterError(job, err, signal);
        }
        if (kind === 'refused') return this.afterError(job, err, signal);
        const outcome = await this.settle(job); // the answer was lost: ask what happened
        this.log({ event: 'settled', job: job.job_id, step, outcome });
        if (outcome === 'completed') return 'completed';
        if (outcome !== 'live') return 'refused';
        this.log({ event: 'rerun', job: job.job_id }); // rolled back: run the transaction again
        continue;
      }
      if (ok) return 'completed';
      // Refused: a cancel was requested, or the claim is no longer ours.
      return signal.reason === 'cancel' ? this.afterError(job, null, signal) : 'refused';
    }
  }

  // The handler failed, was cancelled, or lost its claim.
  async afterError(job, err, signal) {
    if (signal.reason === 'lost') return 'refused';
    if (signal.reason === 'cancel') {
      return (await this.finish('soniq_acknowledge_cancel', job)) ? 'cancelled' : 'refused';
    }
    const message = String((err && err.message) || err).slice(0, 2000);
    return (await this.finish('soniq_fail', job, [message, true])) ? 'failed' : 'refused';
  }

  // LISTEN on soniq_new_job (sent at the commit of every enqueue): a wake-up, never a must.
  async listen() {
    while (!this.stopping) {
      const client = await this.pool.connect().catch(() => null);
      if (!client) { await sleep(1000); continue; }
      let released = false;
      const release = () => { if (!released) { released = true; client.release(true); } };
      const lost = new Promise((resolve) => client.on('error', resolve).on('end', resolve));
      client.on('notification', () => this.wake());
      try {
        await client.query('LISTEN soniq_new_job');
        this.unlisten = release;
        await lost;
      } catch (err) { /* reconnect below */ }
      release();
      await sleep(500);
    }
  }

  async start() {
    await this.register();
    this.listen();
    const beats = setInterval(() => this.beatWorker().catch(() => {}),
      this.heartbeatSeconds * 1000);
    this.log({ event: 'started', worker: this.id, queues: this.queues });
    while (!this.stopping) {
      const job = await this.claim().catch((err) => {
        this.log({ event: 'claim-refused', code: err.code });
        return null;
      });
      if (job) { await this.run(job); continue; }
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, this.pollSeconds * 1000);
        this.wake = () => { clearTimeout(timer); resolve(); };
      });
    }
    clearInterval(beats);
    await this.beatWorker('stopped');
    if (this.unlisten) this.unlisten();
    this.log({ event: 'stopped', worker: this.id });
  }

  stop() {
    this.stopping = true;
    this.wake();
  }
}

module.exports = { Worker, outcomeOf };

if (require.main === module) {
  const path = require('node:path');
  const handlers = require(path.resolve(process.argv[2] || './handlers.js'));
  const leaseSeconds = Number(process.env.SONIQ_LEASE_SECONDS || 30);
  // A connection attempt is bounded too, and TCP keepalives find a peer that is gone.
  const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 4,
    connectionTimeoutMillis: Math.max(1000, leaseSeconds * 250), keepAlive: true });
  pool.on('error', () => {}); // an idle connection broke: the pool makes a new one
  const env = (name, fallback) => Number(process.env[name] || fallback);
  const worker = new Worker({
    pool, handlers,
    queues: process.env.SONIQ_QUEUES ? process.env.SONIQ_QUEUES.split(',') : null,
    leaseSeconds,
    heartbeatSeconds: env('SONIQ_HEARTBEAT_SECONDS', 10),
    pollSeconds: env('SONIQ_POLL_INTERVAL', 5),
  });
  for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => worker.stop());
  worker.start().then(() => pool.end()).then(() => process.exit(0), (err) => {
    console.error(`worker failed: ${err.code || ''} ${err.message}`);
    process.exit(1);
  });
}
