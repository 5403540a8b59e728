// A Rust service built as a release (rustc -O: no frame pointers, code packed into the page its
// read-only data ends in): a settlement that fails keeps its 16 KiB buffer for a retry that never
// comes. Usage: claims [settlements/s]. Prints "ready" once running.
use std::collections::HashMap;
use std::thread::sleep;
use std::time::Duration;

#[inline(never)]
fn settle_claim(id: u64, kept: &mut Vec<Box<[u8]>>) {
    let buf = vec![(id & 0xff) as u8; 16384].into_boxed_slice();
    if id % 3 != 0 {
        kept.push(buf); // the failed settlements are kept for a retry that never comes
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rate: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let mut kept: Vec<Box<[u8]>> = Vec::new();
    let mut seen: HashMap<u64, u64> = HashMap::new();
    println!("ready");
    let mut id = 0u64;
    loop {
        for _ in 0..rate / 10 {
            settle_claim(id, &mut kept);
            *seen.entry(id % 64).or_insert(0) += 1;
            id += 1;
        }
        sleep(Duration::from_millis(100));
    }
}
