package mintgate.peer;

import java.net.InetSocketAddress;

import org.eclipse.californium.core.CoapResource;
import org.eclipse.californium.core.CoapServer;
import org.eclipse.californium.core.network.CoapEndpoint;
import org.eclipse.californium.core.server.resources.CoapExchange;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.elements.config.UdpConfig;

/**
 * Californium serving GET /request with "hello world" on 127.0.0.1:PORT
 * (default 5683), with Californium's default configuration. Prints
 * "ready" once the endpoint is bound, then serves until killed.
 */
public final class HelloServer {
    private HelloServer() {}

    public static void main(String[] args) throws Exception {
        int port = args.length > 0 ? Integer.parseInt(args[0]) : 5683;
        CoapConfig.register();
        UdpConfig.register();
        // defaults of the registered modules, without reading or writing a
        // Californium3.properties file in the working folder
        Configuration config = new Configuration();
        CoapServer server = new CoapServer(config);
        CoapEndpoint.Builder b = new CoapEndpoint.Builder();
        b.setConfiguration(config);
        b.setInetSocketAddress(new InetSocketAddress("127.0.0.1", port));
        server.addEndpoint(b.build());
        server.add(new CoapResource("request") {
            @Override
            public void handleGET(CoapExchange exchange) {
                exchange.respond("hello world");
            }
        });
        server.start();
        System.out.println("ready");
        System.out.flush();
        Thread.currentThread().join();
    }
}
