/* System V shared memory no process's RSS shows once detached: publish_frame() makes a segment
 * (IPC_PRIVATE), fills it, hands it on and detaches; the reader's removal (IPC_RMID) is done here
 * for all but every Nth frame, whose segment stays until someone removes it.
 * usage: sysvleak [frames_per_second=20] [frame_bytes=262144] [N=2] */
#include "common.h"
#include <sys/ipc.h>
#include <sys/shm.h>

__attribute__((noinline)) int publish_frame(long id, long bytes, long n)
{
	int shmid = shmget(IPC_PRIVATE, bytes, IPC_CREAT | 0600);
	if (shmid < 0)
		return -1;
	char *p = shmat(shmid, NULL, 0);
	if (p != (void *)-1) {
		memset(p, (int)(id % 251) + 1, bytes);
		shmdt(p);
	}
	if (id % n == 0)
		return -1; /* the consumer never came: the segment stays */
	shmctl(shmid, IPC_RMID, NULL);
	return 0;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 20), bytes = arg_long(argc, argv, 2, 262144), n = arg_long(argc, argv, 3, 2);
	ready();
	for (long id = 1;; id++) {
		publish_frame(id, bytes, n);
		sleep_ms(1000 / rate);
	}
}
