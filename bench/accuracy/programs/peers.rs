// A peer tracker. peers MODE RATE:
//   leak: remember_peer boxes each peer's record; one in four is "pinned" with Box::leak and the
//         returned reference dropped: never freed, nothing points at it;
//   hold: every record is pushed onto the global PEERS list and kept for ever (held growth);
//   lru:  a bounded map of the 4,096 most recent peers (at its bound from the start: a cache).
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::Mutex;
use std::thread::sleep;
use std::time::Duration;

struct Peer {
    id: u64,
    notes: Vec<u8>,
}

static PEERS: Mutex<Vec<Box<Peer>>> = Mutex::new(Vec::new());

#[inline(never)]
fn remember_peer(id: u64) -> Box<Peer> {
    Box::new(Peer { id, notes: vec![b'n'; 1000] })
}

#[inline(never)]
fn pin_peer(p: Box<Peer>) -> u64 {
    let r: &'static mut Peer = Box::leak(p);
    r.id
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("leak").to_string();
    let rate: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let mut lru: HashMap<u64, Box<Peer>> = HashMap::new();
    let mut order: VecDeque<u64> = VecDeque::new();
    let mut id = 1u64;
    let mut sink = 0u64;
    if mode == "lru" {
        while id <= 4096 {
            lru.insert(id, remember_peer(id));
            order.push_back(id);
            id += 1;
        }
    }
    println!("ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    loop {
        for _ in 0..rate / 100 {
            let p = remember_peer(id);
            match mode.as_str() {
                "leak" if id % 4 == 0 => sink += pin_peer(p),
                "hold" => PEERS.lock().unwrap().push(p),
                "lru" => {
                    lru.insert(id, p);
                    order.push_back(id);
                    if order.len() > 4096 {
                        let old = order.pop_front().unwrap();
                        lru.remove(&old);
                    }
                }
                _ => sink += p.id + p.notes.len() as u64,
            }
            id += 1;
        }
        if sink == u64::MAX {
            println!("{}", sink);
        }
        sleep(Duration::from_millis(10));
    }
}
