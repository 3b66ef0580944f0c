package mintgate.peer;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.concurrent.ThreadLocalRandom;

import org.eclipse.paho.client.mqttv3.IMqttDeliveryToken;
import org.eclipse.paho.client.mqttv3.MqttAsyncClient;
import org.eclipse.paho.client.mqttv3.MqttCallback;
import org.eclipse.paho.client.mqttv3.MqttClient;
import org.eclipse.paho.client.mqttv3.MqttClientPersistence;
import org.eclipse.paho.client.mqttv3.MqttConnectOptions;
import org.eclipse.paho.client.mqttv3.MqttMessage;
import org.eclipse.paho.client.mqttv3.persist.MemoryPersistence;
import org.eclipse.paho.client.mqttv3.persist.MqttDefaultFilePersistence;

/**
 * Paper 004's Fig. 5 with Eclipse Paho (Java), the client the paper used,
 * driven by {@code mintgate lab mqtt} so that Paho's runs take turns with
 * mintgate's on the same broker and machine.
 *
 * <p>Usage: {@code java -jar paho-fig5.jar BROKER_URI [memory|file]}. One JVM
 * answers many runs: each line on standard input {@code run METHOD RUN N}
 * is answered by one JSON line on standard output,
 * {@code {"method":..,"run":..,"messages":N,"seconds":S,"missing":M,"out_of_order":O,"duplicates":D,"error":..}};
 * {@code quit} or the end of input ends it. The first line printed is
 * {@code ready}.
 *
 * <p>Methods, both one message in flight: {@code pubqueue_qos1} publishes at
 * QoS 1 and sends the next message only when the previous one is complete
 * (the paper's Pub Queue: deliveryComplete, on the PUBACK);
 * {@code qos2} does the same at QoS 2 (complete on the PUBCOMP), the earlier
 * work's way to keep order. {@link MqttClient#publish} returns exactly
 * when the delivery is complete.
 *
 * <p>A subscriber (QoS 1, or 2 for {@code qos2}) connected before each run
 * checks every message: the leading number of each 26-byte payload
 * ({@code 0001:mintgate-fig5-payload}). A run is timed from the first
 * publish until the last completion and the last arrival. The publisher's
 * persistence is Paho's default, a file store ({@code file}, in a fresh
 * temporary folder per run), or {@code memory}.
 */
public final class PahoFig5 {
    private PahoFig5() {}

    /** What the subscriber saw in one run. */
    private static final class Check implements MqttCallback {
        private final boolean[] seen;
        private int distinct;
        private int duplicates;
        private int inversions;
        private int maxSeen;
        private long lastArrival;

        Check(int n) {
            seen = new boolean[n + 1];
        }

        @Override
        public synchronized void messageArrived(String topic, MqttMessage m) {
            lastArrival = System.nanoTime();
            String s = new String(m.getPayload(), StandardCharsets.US_ASCII);
            int colon = s.indexOf(':');
            int k;
            try {
                k = Integer.parseInt(colon < 0 ? s : s.substring(0, colon));
            } catch (NumberFormatException e) {
                duplicates++;
                return;
            }
            if (k < 1 || k >= seen.length || seen[k]) {
                duplicates++;
                return;
            }
            seen[k] = true;
            distinct++;
            if (k < maxSeen) {
                inversions++;
            }
            maxSeen = Math.max(maxSeen, k);
            notifyAll();
        }

        @Override
        public void connectionLost(Throwable cause) {}

        @Override
        public void deliveryComplete(IMqttDeliveryToken token) {}

        /** Waits until all n came, or 15 s passed without one. */
        synchronized void awaitAll(int n) throws InterruptedException {
            long quietSince = System.nanoTime();
            int last = distinct;
            while (distinct < n) {
                wait(100);
                if (distinct != last) {
                    last = distinct;
                    quietSince = System.nanoTime();
                } else if (System.nanoTime() - quietSince > 15_000_000_000L) {
                    return;
                }
            }
        }
    }

    private static String body(int i) {
        return String.format(Locale.ROOT, "%04d:mintgate-fig5-payload", i);
    }

    private static String run(String uri, String persistence, String method, int run, int n) {
        int qos;
        switch (method) {
            case "pubqueue_qos1":
                qos = 1;
                break;
            case "qos2":
                qos = 2;
                break;
            default:
                return result(method, run, n, 0, n, 0, 0, "unknown method " + method);
        }
        String nonce = Integer.toHexString(ThreadLocalRandom.current().nextInt());
        String topic = "mintgate/lab/fig5/paho/" + method + "/" + run + "/" + nonce;
        MqttAsyncClient sub = null;
        MqttClient pub = null;
        Path dir = null;
        Check check = new Check(n);
        try {
            MqttConnectOptions o = new MqttConnectOptions();
            o.setCleanSession(true);
            o.setAutomaticReconnect(false);
            // One message is in flight at a time here, but Paho 1.2.5 counts a
            // completed publish out of its in-flight total only after
            // publish() has returned, so a fast loop trips its default limit
            // of 10 ("Too many publishes in progress", paho.mqtt.java #551).
            o.setMaxInflight(1000);
            sub = new MqttAsyncClient(uri, "paho-sub-" + nonce, new MemoryPersistence());
            sub.setCallback(check);
            sub.connect(o).waitForCompletion(10_000);
            sub.subscribe(topic, qos).waitForCompletion(10_000);

            MqttClientPersistence store;
            if (persistence.equals("file")) {
                dir = Files.createTempDirectory("paho-fig5-");
                store = new MqttDefaultFilePersistence(dir.toString());
            } else {
                store = new MemoryPersistence();
            }
            pub = new MqttClient(uri, "paho-pub-" + nonce, store);
            pub.setTimeToWait(60_000);
            pub.connect(o);
            byte[][] bodies = new byte[n + 1][];
            for (int i = 1; i <= n; i++) {
                bodies[i] = body(i).getBytes(StandardCharsets.US_ASCII);
            }
            long start = System.nanoTime();
            for (int i = 1; i <= n; i++) {
                // Returns when the delivery is complete (PUBACK / PUBCOMP).
                pub.publish(topic, bodies[i], qos, false);
            }
            long done = System.nanoTime();
            check.awaitAll(n);
            long end;
            synchronized (check) {
                end = check.distinct == n ? Math.max(done, check.lastArrival) : done;
                return result(method, run, n, (end - start) / 1e9, n - check.distinct,
                        check.inversions, check.duplicates, null);
            }
        } catch (Exception e) {
            return result(method, run, n, 0, n, 0, 0, e.toString());
        } finally {
            try {
                if (pub != null) {
                    if (pub.isConnected()) {
                        pub.disconnect(1_000);
                    }
                    pub.close();
                }
                if (sub != null) {
                    if (sub.isConnected()) {
                        sub.disconnect(1_000).waitForCompletion(2_000);
                    }
                    sub.close();
                }
            } catch (Exception e) {
                // The run's figures are already taken.
            }
            if (dir != null) {
                deleteTree(dir);
            }
        }
    }

    private static void deleteTree(Path dir) {
        try (var walk = Files.walk(dir)) {
            walk.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (Exception e) {
            // A temporary folder left behind is harmless.
        }
    }

    private static String result(String method, int run, int n, double seconds, int missing,
            int outOfOrder, int duplicates, String error) {
        String err = error == null ? "null"
                : "\"" + error.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
        return String.format(Locale.ROOT,
                "{\"method\":\"%s\",\"run\":%d,\"messages\":%d,\"seconds\":%.6f,\"missing\":%d,"
                        + "\"out_of_order\":%d,\"duplicates\":%d,\"error\":%s}",
                method, run, n, seconds, missing, outOfOrder, duplicates, err);
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1 || args.length > 2) {
            System.err.println("usage: java -jar paho-fig5.jar BROKER_URI [memory|file]");
            System.exit(2);
        }
        String uri = args[0];
        String persistence = args.length == 2 ? args[1] : "file";
        if (!persistence.equals("file") && !persistence.equals("memory")) {
            System.err.println("persistence must be memory or file, not " + persistence);
            System.exit(2);
        }
        System.out.println("ready");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split("\\s+");
            if (w.length == 1 && w[0].equals("quit")) {
                break;
            }
            String out;
            if (w.length == 4 && w[0].equals("run")) {
                try {
                    out = run(uri, persistence, w[1], Integer.parseInt(w[2]), Integer.parseInt(w[3]));
                } catch (NumberFormatException e) {
                    out = result("?", 0, 0, 0, 0, 0, 0, "bad command: " + line);
                }
            } else {
                out = result("?", 0, 0, 0, 0, 0, 0, "bad command: " + line);
            }
            System.out.println(out);
            System.out.flush();
        }
    }
}
