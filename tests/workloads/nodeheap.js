// Keeps JavaScript objects on V8's heap and Buffers outside it, and prints what Node says of its
// own memory (process.memoryUsage()) as one JSON line a second: the tests' oracle for the split
// memdiag reads from /proc/PID/smaps. usage: node nodeheap.js [objects_per_second=4000] [buffers_per_second=200]
'use strict';

const objects = [], buffers = [];
const perObjects = Math.floor(Number(process.argv[2] || 4000) / 20);
const perBuffers = Math.floor(Number(process.argv[3] || 200) / 20);
let n = 0;
setInterval(() => {
  for (let i = 0; i < perObjects; i++) objects.push({ id: n++, name: `order-${n}`, items: [n, n + 1] });
  for (let i = 0; i < perBuffers; i++) buffers.push(Buffer.alloc(16384, n & 0xff));
}, 50);
setInterval(() => console.log(JSON.stringify(process.memoryUsage())), 1000);
console.log(`ready ${process.pid}`);
