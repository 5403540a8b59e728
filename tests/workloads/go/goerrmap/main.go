// An order service whose error path keeps each failed order's payload in a map that only grows:
// rememberFailure copies the payload into failed[id] and nothing ever deletes it. The function is
// small, so the compiler inlines it into handle (and handle into main): its name survives only in
// the binary's inline tree. Successful orders allocate scratch that becomes garbage at once.
// usage: goerrmap [orders_per_second=400] [fail_one_in=3] [payload_bytes=16384]
package main

import (
	"errors"
	"fmt"
	"memdiag.test/workloads/internal/kit"
	"os"
	"time"
)

var failed = map[int][]byte{}

var errRejected = errors.New("order rejected")

func rememberFailure(id int, payload []byte) {
	kept := make([]byte, len(payload))
	copy(kept, payload)
	failed[id] = kept
}

func handle(id, failOneIn int, payload []byte) error {
	scratch := make([]byte, 4*len(payload)) // request-sized garbage: the GC runs every second or two
	scratch[0] = byte(id)
	if id%failOneIn == 0 {
		rememberFailure(id, payload)
		return errRejected
	}
	sink += int(scratch[0])
	return nil
}

var sink int

func main() {
	rate, failOneIn, size := kit.Arg(1, 400), kit.Arg(2, 3), kit.Arg(3, 16384)
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i)
	}
	fmt.Printf("ready %d\n", os.Getpid())
	perTick := kit.PerTick(rate)
	id := 0
	for range time.Tick(50 * time.Millisecond) {
		for i := 0; i < perTick; i++ {
			id++
			_ = handle(id, failOneIn, payload)
		}
	}
}
