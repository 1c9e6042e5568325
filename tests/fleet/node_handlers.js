'use strict';
// The handlers the fleet tests give the reference Node worker (contrib/node-worker).
// fleet.effect and fleet.node_only write one effect row inside the job's
// transaction (the worker completes in that transaction); tests/fleet/jobs.py
// is the Python twin of fleet.effect.

function pause(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new Error(`aborted: ${signal.reason}`));
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(new Error(`aborted: ${signal.reason}`));
    }, { once: true });
  });
}

async function effect(args, { job, client, signal }) {
  await client.query(
    'INSERT INTO fleet_effects (job_id, generation, runner) VALUES ($1, $2, $3)',
    [job.job_id, job.generation, 'node']);
  await pause(args.ms || 0, signal);
  return { by: 'node', generation: Number(job.generation) };
}

module.exports = {
  'fleet.effect': { transactional: true, run: effect },
  'fleet.node_only': { transactional: true, maxAttempts: 9, run: effect },
  'fleet.flaky': {
    async run(args, { job }) {
      if (job.attempts < 2) throw new Error('the first attempt fails on purpose');
      return { attempts: job.attempts };
    },
  },
  'fleet.slow': { run: (args, { signal }) => pause(60000, signal) },
  // Its first attempt's own statement runs past the statement_timeout it sets (57014).
  'fleet.timeout_once': {
    transactional: true,
    async run(args, context) {
      if (context.job.attempts < 2) {
        await context.client.query("SET LOCAL statement_timeout = '50ms'");
        await context.client.query('SELECT pg_sleep(1)');
      }
      return effect(args, context);
    },
  },
};
