/* Does nothing, once a second: the target of a host-wide probe's floor (what it costs on the host's
 * own traffic, its programs filtering out every event).
 * usage: idle */
#include "common.h"

int main(void)
{
	ready();
	for (;;)
		sleep_ms(1000);
}
