// A bounded cache: lookups that miss fetch a 16 KiB value and keep it, evicting the oldest entry
// once the cache holds capacity entries, so the heap rises while it fills and then stays level
// (values are replaced, never accumulated). The heap profile is written on SIGUSR1 (profile.go).
// usage: gocache [lookups_per_second=400] [capacity=1500] [value_bytes=16384]
package main

import (
	"fmt"
	"os"
	"strconv"
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

func arg(i, fallback int) int {
	if len(os.Args) > i {
		if v, err := strconv.Atoi(os.Args[i]); err == nil {
			return v
		}
	}
	return fallback
}

var sink byte

func main() {
	rate, capacity, size := arg(1, 400), arg(2, 1500), arg(3, 16384)
	c := &cache{capacity: capacity, values: map[int][]byte{}}
	fmt.Printf("ready %d\n", os.Getpid())
	perTick := rate / 20
	if perTick < 1 {
		perTick = 1
	}
	key := 0
	for range time.Tick(50 * time.Millisecond) {
		for i := 0; i < perTick; i++ {
			key++ // every key new: a miss, the oldest evicted once full
			sink += c.fetch(key, size)[0]
		}
	}
}
