// A Rust service leaking the way the issue found one: claims settled at a steady rate, 1 in N kept
// (mem::forget) and never dropped. Built as a release binary (rustc -O -g, no frame pointers),
// legacy or v0 mangling (-C symbol-mangling-version=v0), for the names memdiag reads of it.
// usage: claims [claims_per_second=1000] [N=5]
use std::io::Write;
use std::thread::sleep;
use std::time::Duration;

struct Claim {
    id: u64,
    lines: Vec<u8>,
}

#[inline(never)]
fn settle_claim(id: u64, every: u64) -> u64 {
    let claim = Box::new(Claim { id, lines: vec![(id % 251) as u8 + 1; 1000] });
    let total = claim.lines[(id % 1000) as usize] as u64 + claim.id;
    if id % every == 0 {
        std::mem::forget(claim);
    }
    total
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let every: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    println!("ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let mut sink = 0u64;
    let mut id = 1u64;
    loop {
        for _ in 0..(rate / 10).max(1) {
            sink = sink.wrapping_add(settle_claim(id, every));
            id += 1;
        }
        if sink == 42 {
            println!("{}", sink);
        }
        sleep(Duration::from_millis(100));
    }
}
