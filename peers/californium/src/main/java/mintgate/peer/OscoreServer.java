package mintgate.peer;

import java.net.InetSocketAddress;

import org.eclipse.californium.core.CoapServer;
import org.eclipse.californium.core.coap.CoAP.ResponseCode;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.core.network.CoapEndpoint;
import org.eclipse.californium.core.server.resources.CoapExchange;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.elements.config.UdpConfig;
import org.eclipse.californium.oscore.HashMapCtxDB;
import org.eclipse.californium.oscore.OSCoreCoapStackFactory;
import org.eclipse.californium.oscore.OSCoreResource;

/**
 * Californium's OSCORE server (cf-oscore), for mintgate's interop tests:
 *
 * <pre>OscoreServer PORT SECRET SALT SENDER_ID RECIPIENT_ID</pre>
 *
 * (hex; "-" for empty) on 127.0.0.1:PORT. /secret answers GET with
 * "californium says hi" and takes PUT (answering 2.04 with what it got),
 * and only when the request is protected (OSCoreResource); prints "ready"
 * once bound.
 */
public final class OscoreServer {
    private OscoreServer() {}

    public static void main(String[] a) throws Exception {
        CoapConfig.register();
        UdpConfig.register();
        int port = Integer.parseInt(a[0]);
        HashMapCtxDB db = new HashMapCtxDB();
        db.addContext("coap://127.0.0.1", Oscore.context(false, a[1], a[2], a[3], a[4]));
        OSCoreCoapStackFactory.useAsDefault(db);
        Configuration config = new Configuration();
        CoapServer server = new CoapServer(config);
        CoapEndpoint.Builder b = new CoapEndpoint.Builder();
        b.setConfiguration(config);
        b.setInetSocketAddress(new InetSocketAddress("127.0.0.1", port));
        b.setCustomCoapStackArgument(db);
        server.addEndpoint(b.build());
        server.add(new OSCoreResource("secret", true) {
            @Override
            public void handleGET(CoapExchange exchange) {
                exchange.respond("californium says hi");
            }

            @Override
            public void handlePUT(CoapExchange exchange) {
                exchange.respond(ResponseCode.CHANGED, "got " + exchange.getRequestText());
            }
        });
        server.start();
        System.out.println("ready");
        System.out.flush();
        Thread.currentThread().join();
    }
}
