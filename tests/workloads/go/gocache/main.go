// A bounded cache: lookups that miss fetch a 16 KiB value and keep it, evicting the oldest entry
// once the cache holds capacity entries, so the heap rises while it fills and then stays level
// (values are replaced, never accumulated). The heap profile is written on SIGUSR1 (internal/kit).
// usage: gocache [lookups_per_second=400] [capacity=1500] [value_bytes=16384]
package main

import (
	"fmt"
	"memdiag.test/workloads/internal/kit"
	"os"
	"time"
)

type cache struct {
	capacity int
	values   map[int][]byte
	order    []int // keys, oldest first
}

func (c *cache) fetch(key, size int) []byte {
	if v, ok := c.values[key]; ok {
		return v
	}
	v := make([]byte, size)
	v[0] = byte(key)
	if len(c.order) >= c.capacity {
		delete(c.values, c.order[0])
		c.order = c.order[1:]
	}
	c.values[key] = v
	c.order = append(c.order, key)
	return v
}

var sink byte

func main() {
	rate, capacity, size := kit.Arg(1, 400), kit.Arg(2, 1500), kit.Arg(3, 16384)
	c := &cache{capacity: capacity, values: map[int][]byte{}}
	fmt.Printf("ready %d\n", os.Getpid())
	perTick := kit.PerTick(rate)
	key := 0
	for range time.Tick(50 * time.Millisecond) {
		for i := 0; i < perTick; i++ {
			key++ // every key new: a miss, the oldest evicted once full
			sink += c.fetch(key, size)[0]
		}
	}
}
