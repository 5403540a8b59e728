// An order service whose error branch keeps each failed request's body: rememberFailure copies
// the body into a new Buffer (memory outside V8's heap, an external backing store malloc'd by
// Node's array-buffer allocator) and pushes it onto a module-level array nothing ever empties.
// Good requests allocate a scratch Buffer that becomes garbage at once.
// usage: node [--perf-basic-prof] nodeleak.js [requests_per_second=200] [fail_one_in=3] [body_bytes=16384]
'use strict';

const failed = [];
let sink = 0;

function rememberFailure(id, body) {
  const kept = Buffer.from(body);
  kept.writeUInt32LE(id, 0);
  failed.push(kept);
}

function handleOrder(id, body, failOneIn) {
  const scratch = Buffer.alloc(body.length / 4);
  scratch[0] = id & 0xff;
  if (id % failOneIn === 0) {
    rememberFailure(id, body);
    return false;
  }
  sink += scratch[0];
  return true;
}

function arg(i, fallback) {
  const v = Number.parseInt(process.argv[2 + i] ?? '', 10);
  return Number.isFinite(v) ? v : fallback;
}

const rate = arg(0, 200), failOneIn = arg(1, 3), size = arg(2, 16384);
const body = Buffer.alloc(size, 7);
const perTick = Math.max(1, Math.floor(rate / 20));
let id = 0;
console.log(`ready ${process.pid}`);
// each order is its own callback, as a server's requests are: handleOrder runs from the event loop
setInterval(() => {
  for (let i = 0; i < perTick; i++) {
    id += 1;
    setImmediate(handleOrder, id, body, failOneIn);
  }
}, 50);
