// A goroutine leak: each request starts a goroutine that waits for a reply on a channel nobody
// ever writes to (the requester gave up after its timeout), so the goroutines, each with its stack
// and its request, pile up. The heap profile is written on SIGUSR1 (internal/kit).
// usage: goleak [requests_per_second=100] [request_bytes=4096]
package main

import (
	"fmt"
	"memdiag.test/workloads/internal/kit"
	"os"
	"time"
)

type request struct {
	id   int
	body []byte
}

func awaitReply(r *request, replies chan []byte) {
	reply := <-replies // never sent: the goroutine and r stay forever
	r.body = append(r.body, reply...)
}

func serve(id, size int) {
	r := &request{id: id, body: make([]byte, size)}
	replies := make(chan []byte)
	go awaitReply(r, replies)
	select {
	case <-replies:
	case <-time.After(time.Millisecond): // gives up; the goroutine is left waiting
	}
}

func main() {
	rate, size := kit.Arg(1, 100), kit.Arg(2, 4096)
	fmt.Printf("ready %d\n", os.Getpid())
	perTick := kit.PerTick(rate)
	id := 0
	for range time.Tick(50 * time.Millisecond) {
		for i := 0; i < perTick; i++ {
			id++
			serve(id, size)
		}
	}
}
